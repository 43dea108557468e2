"""Finish the rollout report when the run ends, however it ends.

A host that fails or becomes unreachable in a serial batch with max_fail_percentage: 0 ends the
whole playbook: no later play (the summary) runs. This callback runs at the end of every
ansible-playbook run (v2_playbook_on_stats). When the run opened a rollout record (the fact
rollout_run_dir, set by playbooks/rollout.yml's first play, whose run.json exists), it writes
RUN_DIR/outcome.json (which hosts failed or were unreachable, at which task; which host locks were
not released), releases the controller's run lock if it is still this run's, and re-renders the
report with run.json's report_command: its verdict then says "halted", names the host and lists
the hosts not reached. Any other playbook is left alone. Enabled in ansible.cfg (callbacks_enabled).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: rollout_outcome
type: aggregate
short_description: writes the rollout's outcome and finishes its report when the run ends
description:
  - Writes RUN_DIR/outcome.json and re-renders RUN_DIR/rollout.md at the end of a rollout run,
    also when a halted batch ended the playbook before its summary play.
  - Releases the controller's run lock if it is still this run's.
requirements:
  - enabled through callbacks_enabled in ansible.cfg
"""

# Tasks of roles/rollout/tasks/unlock.yml whose success means a host's lock was released.
_UNLOCK_TASK = "Unlock | remove each host's lock if it is this run's"
# The keys of a lock record that name one run.
_IDENTITY = ("run_id", "controller_id", "pid", "pid_start")


def _write_private(path: Path, text: str) -> None:
    """Write a run file readable by its owner only (0600), whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "rollout_outcome"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._run_dir: str | None = None
        self._lost: dict[str, dict[str, str]] = {}
        self._failed: dict[str, dict[str, str]] = {}
        self._released: set[str] = set()

    def v2_runner_on_ok(self, result) -> None:
        facts = result._result.get("ansible_facts") or {}
        if facts.get("rollout_run_dir"):
            self._run_dir = str(facts["rollout_run_dir"])

    def v2_runner_item_on_ok(self, result) -> None:
        if result._task.name == _UNLOCK_TASK and not result._result.get("skipped"):
            item = result._result.get("item")
            # The loop is over host names (an older unlock looped over slurp results: {item: host}).
            self._released.add(str(item.get("item") if isinstance(item, dict) else item))

    def v2_runner_on_unreachable(self, result) -> None:
        if not result._task.ignore_unreachable:
            self._lost[result._host.get_name()] = self._what(result)

    def v2_runner_on_failed(self, result, ignore_errors: bool = False) -> None:
        if not ignore_errors:
            self._failed[result._host.get_name()] = self._what(result)

    @staticmethod
    def _what(result) -> dict[str, str]:
        return {"task": result._task.get_name(), "msg": str(result._result.get("msg", ""))[:300]}

    def v2_playbook_on_stats(self, stats) -> None:
        if not self._run_dir:
            return
        run_dir = Path(self._run_dir)
        run_path = run_dir / "run.json"
        if not run_path.exists():
            return
        run = json.loads(run_path.read_text())
        # Only the run that wrote run.json (its lock names this ansible-playbook process) finishes it.
        if (run.get("lock") or {}).get("pid") != os.getpid():
            return
        hosts = {}
        for host in run.get("hosts") or []:
            summary = stats.summarize(host)
            hosts[host] = {
                "unreachable": summary["unreachable"] > 0,
                # Failures a rescue handled are not counted here (stats count them as rescued).
                "failed": summary["failures"] > 0,
                **(self._lost.get(host) or (self._failed.get(host) if summary["failures"] else None) or {}),
            }
        checked = run.get("check_mode") in (True, "True", "true")
        locks = {} if checked else self._release_controller_lock(run, hosts)
        outcome = {"hosts": hosts, "locks": locks}
        _write_private(run_dir / "outcome.json", json.dumps(outcome, indent=2) + "\n")
        command = run.get("report_command")
        if not command:
            return
        done = subprocess.run([*command, str(run_dir)], capture_output=True, text=True, check=False)
        report = json.loads((run_dir / "rollout.json").read_text()) if done.returncode == 0 else {}
        verdict = (report.get("run") or {}).get("verdict", f"report failed: {done.stderr[-300:]}")
        self._display.banner("ROLLOUT REPORT")
        self._display.display(f"verdict: {verdict}\nreport: {run_dir / 'rollout.md'}")
        if locks.get("left"):
            self._display.warning(
                "run lock not released on: " + ", ".join(locks["left"]) + " (the next run from this controller "
                "takes them over; see the report's Run lock section)"
            )

    def _release_controller_lock(self, run: dict, hosts: dict) -> dict:
        """Remove the controller's lock if it is still this run's; list the host locks this run
        did not release (no unlock ran for them: the run halted, or they were unreachable)."""
        released = False
        path = Path((run.get("lock_paths") or {}).get("controller") or "/nonexistent")
        try:
            held = json.loads(path.read_text())
            mine = run.get("lock") or {}
            # Same run: its run id, controller id, pid and the pid's start time (roles/rollout
            # filter_plugins/rollout_lock.py); a symlink is never followed.
            same = isinstance(held, dict) and all(held.get(key) == mine.get(key) for key in _IDENTITY)
            if same and not path.is_symlink():
                path.unlink()
                released = True
        except (OSError, ValueError):
            pass
        # Only the hosts whose lock this run took (run.json's "locked"; a host site.yml skipped as
        # converged took none). A run.json without the list (older runs) counts every host.
        locked = run.get("locked", list(hosts))
        left = [
            f"{host} (unreachable)" if hosts[host]["unreachable"] else host
            for host in hosts
            if host in locked and host not in self._released
        ]
        return {"controller_released_at_end": released, "left": left}
