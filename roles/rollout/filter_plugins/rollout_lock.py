"""Filters of the rollout's run lock (roles/rollout/tasks/lock.yml, unlock.yml).

A run holds one lock file on the controller and one on each host, all with the same record:
owner (user@controller), controller (its host name), controller_id (a digest of the host name,
/etc/machine-id, the boot id and the pid namespace: two containers named alike do not share it),
pid and pid_start of the ansible-playbook process, run id, start time and the playbooks' file
names. Never the command line or an -e value (a secret passed with -e must not land in a lock, a
report or a refusal). library/fleet_run_lock.py reads (validates) and writes the files, 0600.
These filters run in the controller's Ansible process, so they can see its processes.

Decision for a lock some other run holds (rollout_lock_decide):
- its pid is gone (or is another process now) on THIS controller (same controller_id): stale,
  taken over with a warning, atomically (only one run can win it: fleet_run_lock's `expect`);
- its pid still runs on this controller: refused (even with rollout_lock_break: stop that run first);
- held from another controller (its pid cannot be checked from here; a reboot of this one counts
  as another) or older than rollout_lock_stale_after_s: refused, naming how to break it
  (the same command plus `-e rollout_lock_break=true`);
- with rollout_lock_break=true, such a lock is broken and taken over with a warning.
A file that is not a lock record refuses the run; its content is never shown.
A host that cannot be read (unreachable) refuses the run: its lock cannot be checked or taken.
The controller's lock and the hosts' locks are kept apart (a host may be named "controller").

rollout_lock_paths_problems checks where the locks and records may be (a full-string match under
the toolkit's state directories) before anything is read or written.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import posixpath
import re
import socket
import time
from typing import Any

BREAK_VAR = "rollout_lock_break"
# The host's state directory of hicache-fleet (defaults/main.yml's paths are under it).
HOST_STATE_DIR = "/var/lib/hicache-fleet"
_NAME = r"[A-Za-z0-9_-][A-Za-z0-9._-]*"
IDENTITY = ("run_id", "controller_id", "pid", "pid_start")


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


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def controller_id() -> str:
    """This controller as no other shares it: a digest (the machine id is not shown) of the host
    name, /etc/machine-id, the boot id and the pid namespace of this process. Two containers named
    alike differ by their pid namespace (and their pids cannot be checked from each other); a
    reboot makes another id (no process of the old boot runs any more)."""
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = ""
    parts = [socket.gethostname(), _read("/etc/machine-id"), _read("/proc/sys/kernel/random/boot_id"), pid_ns]
    return hashlib.sha256("\0".join(["hicache-fleet-controller", *parts]).encode()).hexdigest()[:32]


def _playbooks() -> list[str]:
    """The file names of the playbooks this ansible-playbook runs (never its options)."""
    try:
        from ansible import context

        args = context.CLIARGS.get("args") or ()
    except Exception:  # outside Ansible (tests): no playbooks known
        args = ()
    return [posixpath.basename(str(arg))[:200] for arg in args]


def rollout_lock_record(run_id: str, now: float | None = None) -> dict[str, Any]:
    """The lock record of this run (written to the controller and to every host): who, which
    process on which controller, which run and playbooks. No command line, no -e value."""
    now = time.time() if now is None else now
    pid = _playbook_pid()
    controller = socket.gethostname()
    return {
        "owner": f"{getpass.getuser()}@{controller}",
        "controller": controller,
        "controller_id": controller_id(),
        "pid": pid,
        "pid_start": _pid_start(pid),
        "run_id": run_id,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "started_epoch": int(now),
        "playbooks": _playbooks(),
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
    """Run id, controller id, pid and the pid's start time name one run."""
    return all(lock.get(key) == me.get(key) for key in IDENTITY)


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
    playbooks = ", ".join(lock.get("playbooks") or []) or "?"
    return f"run {lock.get('run_id', '?')} of {owner} (pid {pid}, {playbooks}), since {started}{age}"


def _break_cmd(me: dict[str, Any]) -> str:
    playbooks = " ".join(me.get("playbooks") or []) or "<playbook>"
    return f"ansible-playbook <your options> {playbooks} -e {BREAK_VAR}=true"


def rollout_lock_decide(
    found: list[dict[str, Any]],
    me: dict[str, Any],
    stale_after_s: float = 21600,
    break_lock: bool = False,
    now: float | None = None,
) -> dict[str, Any]:
    """Decide on the locks found: each item {kind (controller or host), where, path, lock (record
    or None), invalid (why the file is not a lock record), unreachable, error}.

    Returns {refuse: [message], take_over: [warning], replace: {controller: expected lock or None,
    hosts: {host: expected lock}}, message: text}: the run may go on (and take every lock) only
    when `refuse` is empty; the locks under `replace` are stale or broken and are replaced (only
    while they still are the expected lock), each with its warning in the output and the report.
    """
    now = time.time() if now is None else now
    refuse: list[str] = []
    take_over: list[str] = []
    replace: dict[str, Any] = {"controller": None, "hosts": {}}
    for item in found:
        kind = item.get("kind", "host")
        name = "the controller" if kind == "controller" else f"host {item.get('where', '?')}"
        where = f"{name} ({item['path']})" if item.get("path") else name
        lock = item.get("lock")
        if item.get("unreachable"):
            refuse.append(
                f"{where}: unreachable, so its run lock cannot be checked or taken "
                f"({item.get('error') or 'no connection'}). Bring it back or leave it out with --limit."
            )
            continue
        if item.get("invalid") or (lock is not None and not isinstance(lock, dict)):
            refuse.append(
                f"{where}: the file is not a run lock of hicache-fleet ({item.get('invalid') or 'not a record'}); "
                "its content is not shown. Look at it, and remove it by hand if no run holds it."
            )
            continue
        if not lock:
            continue
        if _same_run(lock, me):
            continue
        holder = _holder(lock, now)
        same_controller = lock.get("controller_id") == me.get("controller_id")
        age = now - float(lock.get("started_epoch") or 0)
        expected = {key: lock.get(key) for key in IDENTITY}
        if same_controller and not pid_alive(lock.get("pid"), lock.get("pid_start")):
            take_over.append(
                f"{where}: taking over a stale lock: {holder}; that process no longer runs on this "
                "controller (the run ended without releasing it, e.g. halted or killed)"
            )
        elif same_controller:
            refuse.append(
                f"{where}: locked by {holder}, which is still running on this controller. Wait for it "
                f"to finish, or stop that run (kill {lock.get('pid')}) first."
            )
            continue
        elif break_lock:
            take_over.append(f"{where}: breaking the lock of {holder} ({BREAK_VAR}=true)")
        elif age > float(stale_after_s):
            refuse.append(
                f"{where}: stale lock of {holder}: older than rollout_lock_stale_after_s={int(stale_after_s)} s, "
                f"held from another controller (or from this one before a reboot), so its process cannot be "
                f"checked from here. If that run is gone, break the lock with: {_break_cmd(me)}"
            )
            continue
        else:
            refuse.append(
                f"{where}: locked by {holder}. Wait for that run to finish; if it is gone (its "
                f"controller died or rebooted), break the lock with: {_break_cmd(me)}"
            )
            continue
        if kind == "controller":
            replace["controller"] = expected
        else:
            replace["hosts"][item.get("where")] = expected
    lines = []
    if refuse:
        lines = ["ROLLOUT REFUSED: another run holds the lock, or it cannot be checked; nothing was changed.", *refuse]
    elif take_over:
        lines = ["WARNING (run lock):", *take_over]
    return {"refuse": refuse, "take_over": take_over, "replace": replace, "message": "\n".join(lines)}


def rollout_lock_found(results: dict[str, Any], path: str, kind: str = "host") -> list[dict[str, Any]]:
    """{where: fleet_run_lock read result} (where: a host name, or "controller" with
    kind="controller") as the list rollout_lock_decide reads."""
    found = []
    for where, result in results.items():
        result = result or {}
        item: dict[str, Any] = {"kind": kind, "where": where, "path": path, "lock": None}
        if result.get("unreachable"):
            item.update(unreachable=True, error=str(result.get("msg", ""))[:200])
        elif result.get("failed") and not result.get("invalid"):
            item.update(invalid=f"it could not be read: {str(result.get('msg', ''))[:200]}")
        else:
            item.update(lock=result.get("lock"), invalid=result.get("invalid"))
        found.append(item)
    return found


def rollout_lock_replacing(decision: dict[str, Any], kind: str, host: str = "") -> dict[str, Any] | None:
    """The stale lock this run takes over there (fleet_run_lock's expect), or None: take it fresh."""
    replace = (decision or {}).get("replace") or {}
    return replace.get("controller") if kind == "controller" else (replace.get("hosts") or {}).get(host)


def _host_path_problem(var: str, value: Any, state_dir: str) -> str | None:
    if isinstance(value, str) and re.fullmatch(re.escape(state_dir) + rf"(?:/{_NAME})+", value):
        return None
    return (
        f"{var}={value!r} is refused: it must be a file under {state_dir}/ on the hosts (names of "
        f"letters, digits, '.', '_' and '-', none starting with '.'). Set {var} to such a path, or remove "
        "it from the inventory and -e to use the default."
    )


def rollout_lock_host_paths(hostvars: Any, hosts: list[str], defaults: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{host: {variable: its value for that host}} for the variables of `defaults` (the values this
    host sees, the role's defaults among them); a host's own value (inventory, -e) wins."""
    out: dict[str, dict[str, Any]] = {}
    for host in hosts:
        mine = hostvars[host]
        out[host] = {var: (mine[var] if var in mine else default) for var, default in defaults.items()}
    return out


def rollout_lock_paths_problems(
    host_paths: dict[str, dict[str, Any]], controller_path: Any, report_dir: Any, state_dir: str = HOST_STATE_DIR
) -> list[str]:
    """What is wrong with where the run writes its locks and records, before anything is read:
    host_paths {host: {variable: path}} must be files under the hosts' state directory; the
    controller's lock (rollout_lock_controller_path) a file in rollout_report_dir or below."""
    state_dir = state_dir.rstrip("/") or HOST_STATE_DIR
    by_problem: dict[str, list[str]] = {}
    for host, paths in host_paths.items():
        for var, value in sorted(paths.items()):
            problem = _host_path_problem(var, value, state_dir)
            if problem:
                by_problem.setdefault(problem, []).append(str(host))
    problems = [
        problem if len(hosts) == len(host_paths) else f"{problem} (hosts: {', '.join(hosts)})"
        for problem, hosts in by_problem.items()
    ]
    report = posixpath.normpath(str(report_dir or "")) if report_dir else ""
    rel = str(controller_path or "")[len(report) + 1:] if report else ""
    if not (
        report.startswith("/")
        and str(controller_path or "").startswith(report + "/")
        and re.fullmatch(rf"{_NAME}(?:/{_NAME})*", rel)
    ):
        problems.append(
            f"rollout_lock_controller_path={controller_path!r} is refused: it must be a file in "
            f"rollout_report_dir ({report_dir}, an absolute path) or below it (names of letters, digits, "
            "'.', '_' and '-', none starting with '.'). Remove it from the inventory and -e to use the default "
            "(<rollout_report_dir>/rollout.lock)."
        )
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "rollout_lock_record": rollout_lock_record,
            "rollout_lock_found": rollout_lock_found,
            "rollout_lock_decide": rollout_lock_decide,
            "rollout_lock_replacing": rollout_lock_replacing,
            "rollout_lock_host_paths": rollout_lock_host_paths,
            "rollout_lock_paths_problems": rollout_lock_paths_problems,
        }
