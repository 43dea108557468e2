"""First-host smoke, layer 5, run with the host's python3 (standard library only).

  python3 first_host_server.py port-free --host 127.0.0.1 --port 30990
  python3 first_host_server.py wait --unit first-host-smoke.service --url http://127.0.0.1:30990/health_generate \
      --timeout 600 --interval 2

`port-free` says whether nothing listens on the address yet (else the smoke would probe another
server). `wait` polls the unit's state and the health URL until the URL answers 200 while the unit
is active, the unit ends, or --timeout passes; a bounded wait that gives up at once on a unit that
died. Each prints one JSON line; the role's filters decide.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

PROPERTIES = "LoadState,ActiveState,SubState,Result,ExecMainStatus,MainPID"


def port_free(host: str, port: int) -> dict[str, Any]:
    try:
        with socket.create_connection((host, port), timeout=2):
            return {"free": False, "detail": f"something accepts connections on {host}:{port}"}
    except ConnectionRefusedError:
        return {"free": True, "detail": f"nothing listens on {host}:{port}"}
    except OSError as err:
        return {"free": False, "detail": f"cannot tell: {err}"}


def unit_state(unit: str) -> dict[str, str]:
    result = subprocess.run(["systemctl", "show", unit, "-p", PROPERTIES], capture_output=True, text=True,
                            timeout=30, check=False)
    return dict(line.partition("=")[::2] for line in result.stdout.splitlines() if "=" in line)


def wait(unit: str, url: str, timeout: float, interval: float) -> dict[str, Any]:
    start = time.monotonic()
    deadline = start + timeout
    out: dict[str, Any] = {"healthy": False, "ended": False, "polls": 0, "timeout_s": timeout,
                           "interval_s": interval, "last_status": None, "last_error": None}
    state: dict[str, str] = {}
    while True:
        out["polls"] += 1
        state = unit_state(unit)
        if state.get("LoadState") == "not-found" or state.get("ActiveState") in ("failed", "inactive"):
            out["ended"] = True
            out["state"] = (f"LoadState={state.get('LoadState')} ActiveState={state.get('ActiveState')} "
                            f"Result={state.get('Result')}")
            break
        try:
            remaining = max(deadline - time.monotonic(), 0.5)
            with urllib.request.urlopen(url, timeout=min(10.0, remaining)) as response:
                out["last_status"] = response.status
                if response.status == 200:
                    out["healthy"] = True
                    break
        except urllib.error.HTTPError as err:
            out["last_status"] = err.code
            out["last_error"] = f"HTTP {err.code}"
        except (OSError, ValueError) as err:
            out["last_error"] = str(getattr(err, "reason", err))
        if time.monotonic() + interval > deadline:
            break
        time.sleep(interval)
    out["waited_s"] = round(time.monotonic() - start, 1)
    out["unit"] = state
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    free = sub.add_parser("port-free")
    free.add_argument("--host", required=True)
    free.add_argument("--port", type=int, required=True)
    waiting = sub.add_parser("wait")
    waiting.add_argument("--unit", required=True)
    waiting.add_argument("--url", required=True)
    waiting.add_argument("--timeout", type=float, required=True)
    waiting.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.command == "port-free":
        result = port_free(args.host.strip("[]"), args.port)
    else:
        result = wait(args.unit, args.url, args.timeout, args.interval)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
