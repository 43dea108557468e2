"""Load one of the project's Python files (a filter plugin, a module, a script) by its path.

Ansible finds these through its plugin paths, not as packages, so tests import them from their
files: `load("roles/rollout/filter_plugins/rollout.py")`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load(path: str | Path, name: str | None = None) -> ModuleType:
    """The module at `path` (relative to the checkout, or absolute), executed once per call."""
    path = Path(path) if Path(path).is_absolute() else ROOT / path
    spec = importlib.util.spec_from_file_location(name or f"hicache_{path.stem}", path)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
