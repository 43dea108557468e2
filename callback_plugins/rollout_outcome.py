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
import re
import subprocess
import urllib.error
import urllib.request
from datetime import UTC, datetime
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
  - With rollout_notify_url set, posts the run's verdict to that webhook (json or slack), once per run;
    a failed post is a warning and a line of the report, never a failed run.
requirements:
  - enabled through callbacks_enabled in ansible.cfg
"""

# Tasks of roles/rollout/tasks/unlock.yml whose success means a host's lock was released.
_UNLOCK_TASK = "Unlock | remove each host's lock if it is this run's"
# The keys of a lock record that name one run.
_IDENTITY = ("run_id", "controller_id", "pid", "pid_start")


# --- Notification (issue 28 item 3): one message per run, from here, because only here is the final
# verdict known on every path (passed, halted by a batch that ended the playbook, rolled back).
# The same defaults as roles/rollout/defaults/main.yml (the role's defaults are not play vars here).
NOTIFY_DEFAULTS = {
    "rollout_notify_url": "",
    "rollout_notify_format": "json",
    "rollout_notify_timeout_s": 10,
    "rollout_notify_headers": {},
}
# Variables whose values are secrets: never in a message, whatever text carries them.
_SECRET_NAME = re.compile(r"(api_key|token|password|passwd|secret|credential|private_key|notify_url|notify_headers)",
                          re.IGNORECASE)
_URL_CREDENTIALS = re.compile(r"(\w+://)[^/@\s]*@")
REDACTED = "(redacted)"


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def notify_secrets(variables: dict) -> list[str]:
    """The values of every variable named like a secret (and the webhook's URL and headers), which
    no message may carry. Short values (under 4 characters) are left: they would blank common words."""
    found = {text for name, value in variables.items() if _SECRET_NAME.search(str(name)) for text in _strings(value)}
    return sorted((text for text in found if len(text) >= 4), key=len, reverse=True)


def scrub(text, secrets: list[str]) -> str:
    """Text without a URL's user:password@ and without any of the secrets."""
    result = _URL_CREDENTIALS.sub(r"\1(credentials)@", "" if text is None else str(text))
    for secret in secrets:
        result = result.replace(secret, REDACTED)
    return result


def notify_status(verdict: str, report: dict) -> str:
    """One word for the verdict: passed, rolled back (a host failed its gate or its bake and was put
    back), halted (failed or unreachable, not rolled back), bake inconclusive (the bake could not
    judge a batch and rollout_bake_no_traffic=hold held the run), paused (rollout_pause_after), check
    mode, in progress, no host reported."""
    records = [*(report.get("hosts") or []), *(report.get("unreported") or [])]
    if verdict.startswith("halted"):
        return "rolled back" if any(r.get("verdict") == "rolled back" for r in records) else "halted"
    if verdict.startswith("held"):
        return "bake inconclusive"
    for word in ("paused", "check mode", "in progress", "no host reported", "report failed"):
        if verdict.startswith(word):
            return word
    return "passed"


def notify_message(run: dict, report: dict, verdict: str, report_path: str, ended: str) -> dict:
    """The run's verdict as a JSON-able record: who, what, where the report is. No secret goes in
    here unscrubbed (notify_body scrubs every string)."""
    records = [*(report.get("hosts") or []), *(report.get("unreported") or [])]
    by_verdict: dict[str, list[str]] = {}
    for record in records:
        by_verdict.setdefault(str(record.get("verdict")), []).append(str(record.get("host")))
    failing = [r for r in sorted(records, key=lambda r: r.get("order", 0))
               if r.get("verdict") in ("rolled back", "failed", "unreachable")]
    halting = failing[0] if failing else None
    return {
        "verdict": notify_status(verdict, report),
        "summary": verdict,
        "run_id": run.get("run_id"),
        "inventory": run.get("inventory"),
        "hosts": {
            "passed": by_verdict.get("passed", []),
            "failed": [r["host"] for r in failing],
            "unchanged": by_verdict.get("unchanged", []),
            "not_reached": list((report.get("run") or {}).get("not_reached") or []),
        },
        "halting_host": halting.get("host") if halting else None,
        "halting_reason": "; ".join(str(r) for r in (halting.get("reasons") or [])) if halting else None,
        "report": report_path,
        "started": (run.get("lock") or {}).get("started"),
        "ended": ended,
    }


def _scrubbed(value, secrets: list[str]):
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, dict):
        return {key: _scrubbed(item, secrets) for key, item in value.items()}
    if isinstance(value, list):
        return [_scrubbed(item, secrets) for item in value]
    return value


def notify_body(message: dict, fmt: str, secrets: list[str]) -> bytes:
    """The request body: the message as JSON, or Slack's {"text", "blocks"}; every string scrubbed."""
    message = _scrubbed(message, secrets)
    if fmt == "slack":
        hosts = message["hosts"]
        text = f"hicache-fleet rollout {message['run_id']} ({message['inventory']}): {message['verdict']}"
        lines = [
            f"*{message['summary']}*",
            f"passed: {len(hosts['passed'])} · failed: {len(hosts['failed'])} · unchanged: {len(hosts['unchanged'])}"
            f" · not reached: {len(hosts['not_reached'])}",
        ]
        if message["halting_host"]:
            lines.append(f"halted at *{message['halting_host']}*: {message['halting_reason'] or 'no detail'}")
        lines.append(f"report: `{message['report']}` · started {message['started']} · ended {message['ended']}")
        blocks = [
            {"type": "header", "text": {"type": "plain_text", "text": text[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:3000]}},
        ]
        return json.dumps({"text": text, "blocks": blocks}).encode()
    return json.dumps(message).encode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a webhook that redirects is not followed
        return None


def notify_send(url: str, body: bytes, headers: dict, timeout: float, secrets: list[str]) -> tuple[bool, str]:
    """POST the body; (sent, what happened). Never raises; the text names no secret (not the URL)."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **{str(k): str(v)
                                                                                     for k, v in headers.items()}})
    try:
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=timeout) as answer:
            answer.read(65536)
            return True, f"HTTP {answer.status}"
    except urllib.error.HTTPError as error:
        return False, f"HTTP {error.code}"
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return False, scrub(f"{type(reason).__name__}: {reason}", secrets)[:200]


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
        self._play = None

    def v2_playbook_on_play_start(self, play) -> None:
        self._play = play

    def _host_vars(self, host: str | None) -> dict:
        """The variables of a host of the run as its tasks see them (inventory, -e, facts), templated;
        {} when there is no play or the host is unknown. The notify settings live with the rollout's
        other settings (group_vars of sglang_hosts)."""
        if self._play is None or not host:
            return {}
        try:
            from ansible.template import Templar

            manager = self._play.get_variable_manager()
            found = manager._inventory.get_host(host)
            if found is None:
                return {}
            variables = manager.get_vars(play=self._play, host=found, include_hostvars=False)
            templar = Templar(loader=self._play._loader, variables=variables)
            wanted = [name for name in variables if name in NOTIFY_DEFAULTS or _SECRET_NAME.search(str(name))]
            out = {}
            for name in wanted:
                try:
                    out[name] = templar.template(variables[name])
                except Exception:  # noqa: S112 - an untemplatable variable is left out, never fatal
                    continue
            return out
        except Exception as error:
            self._display.warning(f"notify: could not read the run's variables ({type(error).__name__})")
            return {}

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
        # Check mode changes nothing and tells no one: no message.
        notified = None if checked else self._notify(run, run_dir, report, verdict)
        if notified:
            outcome["notify"] = notified
            _write_private(run_dir / "outcome.json", json.dumps(outcome, indent=2) + "\n")
            subprocess.run([*command, str(run_dir)], capture_output=True, text=True, check=False)
        self._display.banner("ROLLOUT REPORT")
        self._display.display(f"verdict: {verdict}\nreport: {run_dir / 'rollout.md'}"
                              + (f"\nnotify: {notified}" if notified else ""))
        if locks.get("left"):
            self._display.warning(
                "run lock not released on: " + ", ".join(locks["left"]) + " (the next run from this controller "
                "takes them over; see the report's Run lock section)"
            )

    def _notify(self, run: dict, run_dir: Path, report: dict, verdict: str) -> str | None:
        """Send the one message of this run when rollout_notify_url is set; what happened ("sent
        (json, HTTP 200)", "failed (...)"), or None when off. A failure is a warning, never fatal."""
        variables = self._host_vars(next(iter(run.get("hosts") or []), None))
        settings = {name: variables.get(name, default) for name, default in NOTIFY_DEFAULTS.items()}
        url = str(settings["rollout_notify_url"] or "")
        if not url:
            return None
        fmt = str(settings["rollout_notify_format"])
        secrets = notify_secrets(variables)
        ended = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            headers = settings["rollout_notify_headers"] or {}
            timeout = float(settings["rollout_notify_timeout_s"])
            message = notify_message(run, report, verdict, str(run_dir / "rollout.md"), ended)
            sent, what = notify_send(url, notify_body(message, fmt, secrets), dict(headers), timeout, secrets)
        except Exception as error:
            sent, what = False, scrub(f"{type(error).__name__}: {error}", secrets)[:200]
        status = f"sent ({fmt}, {what})" if sent else f"failed ({fmt}, {what})"
        if not sent:
            self._display.warning(f"notify: {status}; the run's result is unchanged (see the report)")
        return status

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
