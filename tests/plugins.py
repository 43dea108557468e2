"""Load one of the project's Python files (a filter plugin, a module, a script) by its path.

Ansible finds these through its plugin paths, not as packages, so tests import them from their
files: `load("roles/rollout/filter_plugins/rollout.py")`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"


def load(path: str | Path, name: str | None = None) -> ModuleType:
    """The module at `path` (relative to the checkout, or absolute), executed once per call."""
    path = Path(path) if Path(path).is_absolute() else ROOT / path
    spec = importlib.util.spec_from_file_location(name or f"hicache_{path.stem}", path)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def adhoc_module(tmp_path: Path, module: str, args: dict, *flags: str) -> tuple[int, dict]:
    """`ansible localhost -c local -o -m MODULE -a ARGS [FLAGS]` with the project's ansible.cfg (so its
    library/ and module_utils/): rc and the result; a failed result gets failed: true (-o prints it as
    "FAILED! => {...}")."""
    import json
    import subprocess
    import sys

    ansible = Path(sys.executable).parent / "ansible"
    env = ansible_env(tmp_path)
    proc = subprocess.run(
        [str(ansible if ansible.exists() else "ansible"), "localhost", "-c", "local", "-i", "localhost,",
         "-e", json.dumps({"ansible_python_interpreter": sys.executable}),
         "-o", "-m", module, "-a", json.dumps(args), *flags],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    line = next((line for line in proc.stdout.splitlines() if line.startswith("localhost | ")), None)
    assert line, proc.stdout + proc.stderr
    head, body = line.split(" => ", 1)
    result = json.loads(body)
    if "FAILED!" in head:
        result["failed"] = True
    return proc.returncode, result


def ansible_bin(name: str) -> str:
    """An Ansible command of the checkout's .venv, else the one found on PATH."""
    candidate = VENV_BIN / name
    return str(candidate) if candidate.exists() else name


def ansible_env(tmp_path: Path) -> dict:
    """The environment of an Ansible run with the project's ansible.cfg, its temp files under tmp_path."""
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_REMOTE_TMP=str(tmp_path / "ansible-remote"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_DEPRECATION_WARNINGS="0",
        ANSIBLE_RETRY_FILES_ENABLED="0",
    )
    return env
