"""Puts tests/ on sys.path so every suite can import the shared helpers (procs.py)."""
