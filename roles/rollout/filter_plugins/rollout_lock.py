"""Filters of the rollout's run lock (roles/rollout/tasks/lock.yml, unlock.yml).

A run holds one lock file on the controller and one on each host, all with the same record:
owner (user@controller), controller, pid and pid_start of the ansible-playbook process, run id and
start time. These filters run in the controller's Ansible process, so they can see its processes.

Decision for a lock some other run holds (rollout_lock_decide):
- its pid is gone (or is another process now) on THIS controller: stale, taken over with a warning;
- its pid still runs on this controller: refused (even with rollout_lock_break: stop that run first);
- held from another controller (its pid cannot be checked from here) or older than
  rollout_lock_stale_after_s: refused, with the exact command that breaks it
  (the same command plus `-e rollout_lock_break=true`);
- with rollout_lock_break=true, such a lock is broken and taken over with a warning.
A host that cannot be read (unreachable) refuses the run: its lock cannot be checked or taken.
"""

from __future__ import annotations

import base64
import getpass
import json
import os
import shlex
import socket
import sys
import time
from typing import Any

BREAK_VAR = "rollout_lock_break"


def _pid_start(pid: int) -> str | None:
    """The process's start time since boot (clock ticks, /proc/PID/stat field 22): with the pid,
    it names one process, even after the kernel reuses the pid."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); field 22 is fields[19].
    return None if fields[0] == "Z" else fields[19]


def _playbook_pid() -> int:
    """PID of the ansible-playbook process running this: the topmost of the ancestors (this
    process included) that run the ansible-playbook script (workers are forks of it)."""
    pid, found = os.getpid(), None
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read()
            with open(f"/proc/{pid}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        # The interpreter running the ansible-playbook script (not a shell whose command names it).
        if not any(os.path.basename(arg) == b"ansible-playbook" for arg in cmdline.split(b"\0")[:2]):
            break
        found, pid = pid, parent
    return found or os.getpid()


def rollout_lock_record(run_id: str, now: float | None = None) -> dict[str, Any]:
    """The lock record of this run (written to the controller and to every host)."""
    now = time.time() if now is None else now
    pid = _playbook_pid()
    controller = socket.gethostname()
    return {
        "owner": f"{getpass.getuser()}@{controller}",
        "controller": controller,
        "pid": pid,
        "pid_start": _pid_start(pid),
        "run_id": run_id,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "started_epoch": int(now),
        "command": shlex.join([os.path.basename(sys.argv[0]), *sys.argv[1:]]) if sys.argv else "ansible-playbook",
    }


def pid_alive(pid: Any, pid_start: Any = None) -> bool:
    """The process still runs here (and, when its start time is known, it is the same process)."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    start = _pid_start(pid)
    if start is None:
        return False
    return pid_start in (None, "") or str(pid_start) == start


def _same_run(lock: dict[str, Any], me: dict[str, Any]) -> bool:
    """Run ids name the second a run started: with the controller and pid, they name one run."""
    return all(lock.get(key) == me.get(key) for key in ("run_id", "controller", "pid"))


def _age(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def _holder(lock: dict[str, Any], now: float) -> str:
    started = lock.get("started", "?")
    age = f" ({_age(now - float(lock['started_epoch']))} ago)" if lock.get("started_epoch") is not None else ""
    owner, pid = lock.get("owner", "?"), lock.get("pid", "?")
    return f"run {lock.get('run_id', '?')} of {owner} (pid {pid}), since {started}{age}"


def rollout_lock_decide(
    found: list[dict[str, Any]],
    me: dict[str, Any],
    stale_after_s: float = 21600,
    break_lock: bool = False,
    now: float | None = None,
) -> dict[str, Any]:
    """Decide on the locks found: each item {where, lock (record or None), unreachable, error}.

    Returns {refuse: [message], take_over: [warning], replace: [where], message: text}: the run
    may go on (and take every lock) only when `refuse` is empty; the locks of `replace` are stale
    or broken and are replaced, each with its warning in the output and the report.
    """
    now = time.time() if now is None else now
    refuse: list[str] = []
    take_over: list[str] = []
    replace: list[str] = []
    break_cmd = f"{me.get('command') or 'ansible-playbook ...'} -e {BREAK_VAR}=true"
    for item in found:
        where = f"{item.get('where', '?')} ({item['path']})" if item.get("path") else item.get("where", "?")
        lock = item.get("lock")
        if item.get("unreachable"):
            refuse.append(
                f"{where}: unreachable, so its run lock cannot be checked or taken "
                f"({item.get('error') or 'no connection'}). Bring it back or leave it out with --limit."
            )
            continue
        if not lock:
            continue
        if not isinstance(lock, dict):
            refuse.append(f"{where}: the lock file is not a lock record ({str(lock)[:120]!r}); remove it by hand")
            continue
        if _same_run(lock, me):
            continue
        holder = _holder(lock, now)
        same_controller = lock.get("controller") == me.get("controller")
        age = now - float(lock.get("started_epoch") or 0)
        if same_controller and not pid_alive(lock.get("pid"), lock.get("pid_start")):
            replace.append(item.get("where"))
            take_over.append(
                f"{where}: taking over a stale lock: {holder}; that process no longer runs on this "
                "controller (the run ended without releasing it, e.g. halted or killed)"
            )
        elif same_controller:
            refuse.append(
                f"{where}: locked by {holder}, which is still running on this controller. Wait for it "
                f"to finish, or stop that run (kill {lock.get('pid')}) first."
            )
        elif break_lock:
            replace.append(item.get("where"))
            take_over.append(f"{where}: breaking the lock of {holder} ({BREAK_VAR}=true)")
        elif age > float(stale_after_s):
            refuse.append(
                f"{where}: stale lock of {holder}: older than rollout_lock_stale_after_s={int(stale_after_s)} s, "
                f"held from another controller, so its process cannot be checked from here. If that run "
                f"is gone, break the lock with: {break_cmd}"
            )
        else:
            refuse.append(
                f"{where}: locked by {holder}. Wait for that run to finish; if it is gone (its "
                f"controller died), break the lock with: {break_cmd}"
            )
    lines = []
    if refuse:
        lines = ["ROLLOUT REFUSED: another run holds the lock; nothing was changed.", *refuse]
    elif take_over:
        lines = ["WARNING (run lock):", *take_over]
    return {"refuse": refuse, "take_over": take_over, "replace": replace, "message": "\n".join(lines)}


def rollout_lock_found(results: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """{where: slurp result} (where: "controller" or a host name) as the list rollout_lock_decide
    reads: the lock record (None when there is no lock file), or why it could not be read."""
    found = []
    for where, result in results.items():
        result = result or {}
        item: dict[str, Any] = {"where": where, "path": path, "lock": None}
        if result.get("unreachable"):
            item.update(unreachable=True, error=str(result.get("msg", ""))[:200])
        elif result.get("content"):
            raw = base64.b64decode(result["content"]).decode("utf-8", "replace")
            try:
                item["lock"] = json.loads(raw)
            except ValueError:
                item["lock"] = raw
        found.append(item)
    return found


def rollout_lock_is(result: dict[str, Any], me: dict[str, Any] | None) -> bool:
    """A slurp result of a lock file holds the lock of the run `me` (what unlock.yml removes)."""
    found = rollout_lock_found({"?": result}, "")[0]
    return isinstance(found["lock"], dict) and isinstance(me, dict) and _same_run(found["lock"], me)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "rollout_lock_record": rollout_lock_record,
            "rollout_lock_found": rollout_lock_found,
            "rollout_lock_decide": rollout_lock_decide,
            "rollout_lock_is": rollout_lock_is,
        }
