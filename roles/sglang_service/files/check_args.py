#!/usr/bin/env python3
"""Parse a rendered SGLang launch command line with the installed SGLang's own parser.

Usage: <venv python> check_args.py ARGV_JSON

ARGV_JSON holds the server arguments as a JSON list (what follows `-m sglang.launch_server`). Runs
`sglang.srt.server_args.prepare_server_args`, exactly what `python -m sglang.launch_server` parses,
without resolving (no GPU, no model needed). Prints one JSON object on stdout:
  {"ok": true, "version": ...}                       accepted, exit 0
  {"ok": false, "message": "<SGLang's own message>"} rejected, exit 2
  {"ok": false, "message": "...", "import_error": true} SGLang not importable, exit 3
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def _last_error(text: str) -> str:
    """argparse prints usage then `prog: error: msg`; keep the error line(s)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if ": error: " in line]
    return errors[-1] if errors else (lines[-1] if lines else "argument parsing failed")


def check(argv: list[str]) -> tuple[int, dict]:
    try:
        import sglang
        from sglang.srt.server_args import prepare_server_args
    except Exception as exc:
        return 3, {"ok": False, "import_error": True, "message": f"cannot import SGLang's parser: {exc}"}
    if "--config" in argv:
        try:
            import yaml  # noqa: F401 - SGLang's --config reader imports it
        except ImportError:
            return 3, {"ok": False, "import_error": True,
                       "message": "SGLang's --config (the api keys' file) needs PyYAML in the venv, which has none "
                                  "(a full SGLang install gets it with transformers; add pyyaml to the venv)"}
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            prepare_server_args(argv)
    except SystemExit as exc:
        if exc.code in (0, None):
            return 0, {"ok": True, "version": getattr(sglang, "__version__", "unknown")}
        return 2, {"ok": False, "message": _last_error(captured.getvalue())}
    except Exception as exc:
        return 2, {"ok": False, "message": f"{type(exc).__name__}: {exc}"}
    return 0, {"ok": True, "version": getattr(sglang, "__version__", "unknown")}


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 64
    with open(sys.argv[1], encoding="utf-8") as handle:
        argv = json.load(handle)
    if not isinstance(argv, list) or not all(isinstance(word, str) for word in argv):
        print(json.dumps({"ok": False, "message": "ARGV_JSON must be a JSON list of strings"}))
        return 64
    code, result = check(argv)
    print(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())
