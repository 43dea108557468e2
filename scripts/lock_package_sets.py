#!/usr/bin/env python3
"""Lock files of the sglang_venv package sets, and the check that a lock still resolves.

    scripts/lock_package_sets.py lock [SET ...]     (make lock) write roles/sglang_venv/files/locks/<set>.txt
    scripts/lock_package_sets.py check LOCK [...]   resolve the lock's PyPI pins again, without installing

Each lock holds exact versions and sha256 hashes for CPython 3.12 on manylinux x86_64 (glibc 2.39,
Ubuntu 24.04; SGLang's own wheels need manylinux_2_34), resolved by uv from the set's steps in
roles/sglang_venv/defaults/main.yml: the steps that install with dependencies in one resolution
(torch and its triton from PyTorch's index through uv's torch backend, the set's `lock.torch_backend`;
everything else from PyPI; the set's `lock.exclude` left out), the `no_deps` steps (sglang itself,
the Radeon plugin) pinned alone. The role installs it with `pip install --require-hashes --no-deps`.

When PyTorch's index cannot be reached, the lock is written without the packages it serves and says
so in a line `# incomplete: ...`; the role refuses an incomplete lock. The ROCm wheels' mirror is the
role's sglang_venv_rocm_torch_index_url, or SGLANG_VENV_ROCM_TORCH_INDEX_URL in the environment (so a
mirror with user:password@ need not be written into the defaults). Its credentials reach uv in a netrc
file (NETRC: 0600 in a 0700 temporary directory, removed when uv ends), never its command line; the
lock file and the output name the URL without them. `check` resolves every pin the
lock takes from PyPI for the same target with uv (`--no-deps`, nothing installed) and compares the
hashes, so a pin that no longer exists, or a file that changed, fails before a fleet installs it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = ROOT / "roles/sglang_venv/defaults/main.yml"
# The role's own rules for an index URL's credentials (the URL without them, the netrc text).
FILTERS = ROOT / "roles/sglang_venv/filter_plugins/sglang_venv.py"
MIRROR_ENV = "SGLANG_VENV_ROCM_TORCH_INDEX_URL"
LOCKS = ROOT / "roles/sglang_venv/files/locks"
PYTHON_VERSION = "3.12"
PLATFORM = "x86_64-manylinux_2_39"
# What uv's torch backend takes from PyTorch's index (the rest of uv's list is not in any set).
TORCH_INDEX_PACKAGES = ("torch", "pytorch-triton-rocm", "triton-rocm", "pytorch-triton", "torchvision", "torchaudio")
UNREACHABLE = re.compile(r"dns error|error sending request|Connect|timed out|Network is unreachable", re.I)
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _filters() -> Any:
    spec = importlib.util.spec_from_file_location("sglang_venv_filters", FILTERS)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def package_sets(defaults_file: Path = DEFAULTS, mirror: str | None = None) -> dict[str, Any]:
    """The role's package sets with their Jinja references to other defaults rendered; `mirror`, when
    given, as sglang_venv_rocm_torch_index_url."""
    defaults = yaml.safe_load(defaults_file.read_text())
    if mirror:
        defaults["sglang_venv_rocm_torch_index_url"] = mirror
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)  # noqa: S701 (not HTML)

    def render(value: Any) -> Any:
        if isinstance(value, str) and "{{" in value:
            return render(env.from_string(value).render(**defaults))
        if isinstance(value, list):
            return [render(v) for v in value]
        if isinstance(value, dict):
            return {k: render(v) for k, v in value.items()}
        return value

    sets = defaults["sglang_venv_package_sets"]
    out = {}
    for name, spec in sets.items():
        steps = [{**step, "packages": _packages(render(step["packages"]), defaults, env)} for step in spec["steps"]]
        out[name] = {**spec, "steps": steps, "lock": render(spec.get("lock", {}))}
    return out


def _packages(value: Any, defaults: dict[str, Any], env: jinja2.Environment) -> list[str]:
    # `packages: "{{ sglang_venv_sglang_runtime_deps }}"` renders to a list's repr: take the list itself.
    if isinstance(value, str) and value.startswith("["):
        return list(yaml.safe_load(value))
    return list(value)


def uv_binary() -> str | None:
    here = Path(sys.executable).parent / "uv"
    return str(here) if here.exists() else shutil.which("uv")


def uv_compile(uv: str, requirements: list[str], *args: str, netrc: str = "") -> subprocess.CompletedProcess[str]:
    """`uv pip compile` of these requirements for the lock's target, hashes on, no header. `netrc`: the
    credentials of the URLs in `args` (which hold none), for uv in a netrc file (NETRC) that lives in
    the temporary directory (0700) as long as uv runs."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "requirements.in"
        src.write_text("\n".join(requirements) + "\n")
        cmd = [uv, "pip", "compile", str(src), "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
               "--generate-hashes", "--no-header", "--no-annotate", "--quiet", *args]
        env = {**os.environ, "UV_NO_CONFIG": "1"}
        if netrc:
            path = Path(tmp) / "netrc"
            path.touch(mode=0o600)
            path.write_text(netrc)
            env["NETRC"] = str(path)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False, env=env, cwd=tmp)


def parse_lock(text: str) -> dict[str, dict[str, Any]]:
    """``{canonical name: {name, version, hashes, block}}`` of a requirements file with hashes."""
    entries: dict[str, dict[str, Any]] = {}
    current = None
    for line in text.splitlines():
        match = _ENTRY.match(line)
        if match:
            current = {"name": match.group(1), "version": match.group(2), "hashes": set(), "block": [line]}
            entries[canonical(match.group(1))] = current
        elif current and line.startswith((" ", "\t")) and line.strip():
            current["hashes"].update(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
            current["block"].append(line)
        elif not line.startswith((" ", "\t")):
            current = None
    return entries


def header_value(text: str, key: str) -> str:
    match = re.search(rf"^# {key}: (.*)$", text, re.M)
    return match.group(1).strip() if match else ""


def lock_set(uv: str, name: str, spec: dict[str, Any]) -> tuple[str, str]:
    """The lock file's text for one set, and a one-line summary.

    Torch comes from one of two sources: PyTorch's index through uv's torch backend
    (``lock.torch_backend``), or a find-links page of torch builds (``lock.torch_find_links``, e.g.
    a mirror of AMD's per-release ROCm wheels; ``lock.torch_packages`` names what it serves). When
    that source is unreachable or not given, the lock is written without those packages and says so."""
    lock = spec.get("lock", {})
    backend = str(lock.get("torch_backend") or "")
    # The find-links URL without its user:password@ on uv's argv and in the lock; uv reads them from netrc.
    given = str(lock.get("torch_find_links") or "")
    auth = _filters().netrc_of(
        [(f"lock.torch_find_links of package set {name} (sglang_venv_rocm_torch_index_url or {MIRROR_ENV})", given)])
    if auth["errors"]:
        raise SystemExit(f"{name}: " + "; ".join(auth["errors"]))
    find_links = _filters().url_public(given)
    from_torch = tuple(canonical(p) for p in lock.get("torch_packages", TORCH_INDEX_PACKAGES))
    exclude = [canonical(p) for p in lock.get("exclude", [])]
    with_deps = [p for s in spec["steps"] if not s.get("no_deps") for p in s["packages"]]
    alone = [p for s in spec["steps"] if s.get("no_deps") for p in s["packages"]]
    torch_source = (f"the find-links page {find_links}" if find_links
                    else f"PyTorch's index (uv --torch-backend {backend})" if backend else "")
    with tempfile.TemporaryDirectory() as tmp:
        excludes = Path(tmp) / "excludes.txt"
        excludes.write_text("\n".join(exclude) + "\n")
        args = ["--excludes", str(excludes)]
        args += ["--find-links", find_links] if find_links else (["--torch-backend", backend] if backend else [])
        needs_source = "torch_find_links" in lock and not find_links
        resolved = None if needs_source else uv_compile(uv, with_deps, *args, netrc=auth["netrc"])
        incomplete = ""
        if needs_source or (resolved.returncode != 0 and torch_source and UNREACHABLE.search(resolved.stderr)):
            # The torch source is out of reach: lock what PyPI serves, and say what is missing.
            missing = [p for p in with_deps if canonical(re.split(r"[=<>!~ ;\[]", p)[0]) in from_torch]
            excludes.write_text("\n".join(exclude + list(from_torch)) + "\n")
            resolved = uv_compile(uv, [p for p in with_deps if p not in missing], "--excludes", str(excludes))
            where = torch_source or "its torch source"
            incomplete = (f"{', '.join(missing)} and what they need from {where} could not be resolved here"
                          + (" (no torch_find_links given: set sglang_venv_rocm_torch_index_url to a mirror of "
                             "AMD's ROCm wheels)" if needs_source else "")
                          + ": run `make lock` where that source is reachable")
        if resolved.returncode != 0:
            raise SystemExit(f"{name}: uv pip compile failed:\n{resolved.stderr.strip()}")
        pinned = uv_compile(uv, alone, "--no-deps") if alone else None
        if pinned is not None and pinned.returncode != 0:
            raise SystemExit(f"{name}: uv pip compile --no-deps failed:\n{pinned.stderr.strip()}")
    entries = parse_lock(resolved.stdout)
    entries.update(parse_lock(pinned.stdout) if pinned else {})
    from_torch_index = sorted(e["name"] for k, e in entries.items() if torch_source and k in from_torch)
    version = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    lines = [
        f"# Lock of the sglang_venv package set {name}: written by `make lock` (scripts/lock_package_sets.py); "
        "do not edit.",
        f"# target: CPython {PYTHON_VERSION}, {PLATFORM}; resolver: {version}",
        f"# torch backend: {backend or find_links or 'none'}; excluded: {', '.join(exclude) or 'none'}",
        f"# from PyTorch's index: {', '.join(from_torch_index) or 'none'}",
        f"# no-deps steps: {', '.join(alone) or 'none'}",
    ]
    if incomplete:
        lines.append(f"# incomplete: {incomplete}")
    body = [line for key in sorted(entries) for line in entries[key]["block"]]
    summary = f"{name}: {len(entries)} packages" + (" (INCOMPLETE: " + incomplete + ")" if incomplete else "")
    return "\n".join(lines + body) + "\n", summary


def check_lock(uv: str, path: Path) -> tuple[bool | None, str]:
    """Resolve the lock's PyPI pins again for its target (nothing installed): ``(True, summary)``,
    ``(False, what is wrong)``, or ``(None, why it could not be checked)`` when PyPI is unreachable."""
    text = path.read_text()
    entries = parse_lock(text)
    from_torch_index = {canonical(n) for n in header_value(text, "from PyTorch's index").split(", ") if n != "none"}
    pypi = {k: e for k, e in entries.items() if k not in from_torch_index}
    if not pypi:
        return False, f"{path}: no pinned packages"
    result = uv_compile(uv, [f"{e['name']}=={e['version']}" for e in pypi.values()], "--no-deps")
    if result.returncode != 0:
        if UNREACHABLE.search(result.stderr):
            return None, f"PyPI is unreachable from here: {result.stderr.strip().splitlines()[-1]}"
        target = f"CPython {PYTHON_VERSION} {PLATFORM}"
        return False, f"{path.name}: the pins do not resolve for {target}:\n{result.stderr.strip()}"
    fresh = parse_lock(result.stdout)
    wrong = [f"{e['name']}=={e['version']}: the lock's hashes are not what PyPI serves"
             for k, e in pypi.items() if k in fresh and not e["hashes"] <= fresh[k]["hashes"]]
    if wrong:
        return False, f"{path.name}: " + "; ".join(wrong)
    return True, f"{path.name}: {len(pypi)} pins from PyPI resolve for CPython {PYTHON_VERSION} {PLATFORM}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lock = sub.add_parser("lock", help="write the lock files (all sets, or the ones named)")
    lock.add_argument("sets", nargs="*")
    check = sub.add_parser("check", help="resolve a lock's PyPI pins again, without installing")
    check.add_argument("locks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    uv = uv_binary()
    if not uv:
        print("uv is not installed: `make setup` installs it into .venv (requirements/controller.txt)", file=sys.stderr)
        return 2
    if args.command == "lock":
        sets = package_sets(mirror=os.environ.get(MIRROR_ENV) or None)
        LOCKS.mkdir(parents=True, exist_ok=True)
        for name in args.sets or sorted(sets):
            text, summary = lock_set(uv, name, sets[name])
            (LOCKS / f"{name}.txt").write_text(text)
            print(summary)
        return 0
    status = 0
    for path in args.locks or sorted(LOCKS.glob("*.txt")):
        ok, message = check_lock(uv, path)
        print(message)
        status = max(status, {True: 0, None: 3, False: 1}[ok])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
