# hicache-fleet: free disk for what a run stages, summed per filesystem (library/fleet_free_disk.py).
# The one implementation of the free-disk check: preflight runs it before any change (ROCm, its .debs,
# a venv release, the models, the L3 tiers), the models role before each fetch.
# Plain functions, unit-tested in tests/test_fleet_free_disk.py.
# Runs on the managed host with its system Python: standard library only.

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

ARGUMENT_SPEC = {
    "needs": {"type": "list", "elements": "dict", "required": True},
    "host": {"type": "str", "required": True},
    "fail_msg": {"type": "str"},
}


def nearest_existing(path: str, exists: Callable[[str], bool] = os.path.exists) -> str:
    """`path`, or its nearest parent that exists (what a run will create lives on that filesystem).
    A link counts by its target, as df reads it: a dangling one is passed over to its parent."""
    current = os.path.abspath(path or "/")
    while not exists(current) and current != os.path.dirname(current):
        current = os.path.dirname(current)
    return current


def mount_point(path: str) -> str:
    """The mount point of the filesystem `path` is on (df's "Mounted on")."""
    current = os.path.realpath(path)
    while not os.path.ismount(current):
        current = os.path.dirname(current)
    return current


def measure(path: str) -> dict[str, Any]:
    """Free bytes for an unprivileged writer (df's Available: f_bavail x f_frsize) and the mount."""
    existing = nearest_existing(path)
    stat = os.statvfs(existing)
    return {"free": stat.f_bavail * stat.f_frsize, "mount": mount_point(existing)}


def validate_needs(needs: Sequence[Any]) -> list[str]:
    """Every malformed need, one sentence each (a caller's bug, not an operator's input)."""
    errors = []
    for number, need in enumerate(needs, start=1):
        if not isinstance(need, Mapping):
            errors.append(f"needs[{number}] is not a mapping")
            continue
        missing = [key for key in ("path", "need_bytes", "what", "fix") if key not in need]
        if missing:
            errors.append(f"needs[{number}] lacks {', '.join(missing)}")
            continue
        try:
            float(need["need_bytes"])
        except (TypeError, ValueError):
            errors.append(f"needs[{number}].need_bytes = {need['need_bytes']!r} is not a number")
        if not str(need["path"]).startswith("/"):
            errors.append(f"needs[{number}].path = {need['path']!r} is not absolute")
    return errors


def findings(measured: Sequence[Mapping[str, Any]], host: str) -> list[str]:
    """One finding per filesystem whose free space does not hold the needs on it.

    measured: per need {need: {path, need_bytes, what, fix}, free, mount}. Needs on one filesystem
    (/, /opt and the model store often are one) must fit together; a need of 0 bytes is none.
    """
    mounts: dict[str, dict[str, Any]] = {}
    for entry in measured:
        need = entry["need"]
        need_bytes = int(float(need.get("need_bytes") or 0))
        if need_bytes <= 0:
            continue
        mount = mounts.setdefault(str(entry["mount"]), {"free": int(entry["free"]), "need": 0, "items": []})
        mount["need"] += need_bytes
        mount["items"].append(need)
    found = []
    for mount, entry in mounts.items():
        if entry["free"] >= entry["need"]:
            continue
        items = entry["items"]
        if len(items) == 1:
            item = items[0]
            found.append(
                f"{item.get('path')} on {host} has {entry['free'] / 1e9:.1f} GB free; {item.get('what')} needs "
                f"{entry['need'] / 1e9:.1f} GB. {item.get('fix')}"
            )
            continue
        parts = "; ".join(
            f"{item.get('what')} under {item.get('path')}: {int(float(item.get('need_bytes'))) / 1e9:.1f} GB"
            for item in items
        )
        fixes = " ".join(dict.fromkeys(str(item.get("fix")) for item in items))
        found.append(
            f"the filesystem at {mount} on {host} has {entry['free'] / 1e9:.1f} GB free, but this run stages "
            f"{entry['need'] / 1e9:.1f} GB there ({parts}). {fixes}"
        )
    return found


def failure_message(found: Sequence[str], prefix: str) -> str:
    """The module's failure: the caller's sentence, then each finding numbered."""
    numbered = [f"  {number}. {' '.join(item.split())}" for number, item in enumerate(found, start=1)]
    lines = [f"{prefix.rstrip(': ')}:", *numbered]
    return "\n".join(lines)


def check(needs: Sequence[Mapping[str, Any]], host: str,
          measure_fn: Callable[[str], Mapping[str, Any]] = measure) -> dict[str, Any]:
    """Measure every need's filesystem (once per path) and return the findings with what was read."""
    cache: dict[str, Mapping[str, Any]] = {}
    measured = []
    for need in needs:
        path = str(need["path"])
        if int(float(need.get("need_bytes") or 0)) <= 0:
            continue
        if path not in cache:
            cache[path] = measure_fn(path)
        measured.append({"need": dict(need), **cache[path]})
    filesystems = {}
    for entry in measured:
        filesystems.setdefault(entry["mount"], entry["free"])
    return {"findings": findings(measured, host), "filesystems": filesystems}
