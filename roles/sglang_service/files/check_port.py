#!/usr/bin/env python3
"""Is a TCP port free for one SGLang instance? Standard library only.

Usage: python3 check_port.py --address ADDR --port PORT --unit UNIT

Lists TCP listeners on PORT (`ss -Hltnp`) whose address overlaps ADDR (same address, or either side
a wildcard). A listener is fine when its process belongs to UNIT's cgroup (the running instance
itself). Prints one JSON object: {"free": bool, "conflicts": [...]}; exit 0 if free, 1 if taken.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

_WILDCARDS = {"0.0.0.0", "*", "::", "[::]"}  # noqa: S104 - listeners to compare with, not a bind
_PID = re.compile(r"\"([^\"]*)\",pid=(\d+)")


def _split_address(local: str) -> tuple[str, str]:
    host, _, port = local.rpartition(":")
    host = host.strip("[]")
    if "%" in host:
        host = host.split("%", 1)[0]
    return host, port


def _overlaps(ours: str, theirs: str) -> bool:
    ours = ours.strip("[]")
    return ours == theirs or ours in _WILDCARDS or theirs in _WILDCARDS or theirs == "::"


def _in_unit(pid: int, unit: str) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            return any(line.rstrip().endswith(f"/{unit}") or f"/{unit}/" in line for line in handle)
    except OSError:
        return False


def conflicts(address: str, port: int, unit: str) -> list[dict]:
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], check=True, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        host, local_port = _split_address(fields[3])
        if local_port != str(port) or not _overlaps(address, host):
            continue
        owners = [(name, int(pid)) for name, pid in _PID.findall(line)]
        if owners and all(_in_unit(pid, unit) for _, pid in owners):
            continue
        found.append(
            {
                "listen": fields[3],
                "processes": [f"{name} (pid {pid})" for name, pid in owners]
                or ["a process not visible from this host"],
            }
        )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--unit", required=True)
    args = parser.parse_args()
    found = conflicts(args.address, args.port, args.unit)
    print(json.dumps({"free": not found, "conflicts": found}))
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())
