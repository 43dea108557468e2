#!/usr/bin/python
# hicache-fleet: one health poll of an SGLang instance, with its systemd unit's state.
# Runs on the managed host with its system Python: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_service_health
short_description: Poll an SGLang instance's health endpoint once and say whether its unit failed
description:
  - >-
    Sends one C(GET) to the instance's health endpoint and reads its systemd unit's state
    (C(systemctl show)). Used with C(until) by the sglang_service role's wait: it stops waiting
    when the instance is healthy, or as soon as waiting longer cannot help because the unit failed,
    exited, or is crash-looping.
  - >-
    Gives up (O(gave_up)) when the unit is not loaded, its ActiveState is C(failed) or
    C(inactive), its SubState is C(auto-restart) (the process exited and systemd waits to restart
    it), or its NRestarts grew beyond O(restarts_before).
  - Never fails for an unhealthy instance; the caller decides (C(failed_when)). Read-only.
version_added: "0.2.0"
author: hicache-fleet
options:
  url:
    description: Health URL, e.g. C(http://127.0.0.1:30004/health_generate).
    type: str
    required: true
  unit:
    description: The instance's systemd unit, e.g. C(sglang-main.service).
    type: str
    required: true
  api_key:
    description: Sent as C(Authorization) C(Bearer) header when set.
    type: str
  timeout:
    description: Seconds the health request may take.
    type: int
    default: 30
  restarts_before:
    description: >-
      The unit's NRestarts when the wait began; more than that means systemd restarted the process
      while we waited. C(-1) ignores NRestarts.
    type: int
    default: -1
"""

EXAMPLES = r"""
- name: Wait until healthy, or until the unit failed
  sglang_service_health:
    url: http://127.0.0.1:30004/health_generate
    unit: sglang-main.service
  register: _health
  until: _health.healthy or _health.gave_up
  retries: 360
  delay: 5
  failed_when: not _health.healthy
"""

RETURN = r"""
status:
  description: HTTP status of the health request, -1 when nothing answered.
  returned: always
  type: int
healthy:
  description: The health endpoint answered 200.
  returned: always
  type: bool
gave_up:
  description: The instance is not healthy and waiting longer cannot help (see O(reason)).
  returned: always
  type: bool
reason:
  description: Why waiting longer cannot help, empty when it can.
  returned: always
  type: str
unit_state:
  description: The unit's LoadState, ActiveState, SubState, Result, NRestarts, ExecMainCode, ExecMainStatus, MainPID.
  returned: always
  type: dict
unit_summary:
  description: >-
    The unit's state in one line, e.g.
    C(ActiveState=failed SubState=failed Result=exit-code NRestarts=0 exit status 1).
  returned: always
  type: str
msg:
  description: The health answer in a few words.
  returned: always
  type: str
"""

import urllib.error
import urllib.request
from collections.abc import Mapping

from ansible.module_utils.basic import AnsibleModule

PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts", "ExecMainCode", "ExecMainStatus",
              "MainPID")
# ExecMainCode is a siginfo si_code: CLD_EXITED, CLD_KILLED, CLD_DUMPED.
_EXITED, _KILLED, _DUMPED = "1", "2", "3"


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p A,B UNIT` output (KEY=VALUE lines) as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _int(value: object, default: int = 0) -> int:
    try:
        return int(str(value))
    except ValueError:
        return default


def verdict(props: Mapping[str, str], restarts_before: int = -1) -> str:
    """Why waiting longer for this unit cannot help; empty while it may still become healthy."""
    active, sub = props.get("ActiveState", ""), props.get("SubState", "")
    if props.get("LoadState", "loaded") not in ("loaded", ""):
        return f"the unit is not loaded (LoadState={props['LoadState']})"
    if active == "failed":
        return "the unit failed"
    if sub == "auto-restart":
        return "its process exited and systemd waits to restart it (SubState=auto-restart)"
    restarts = _int(props.get("NRestarts", "0"))
    if restarts_before >= 0 and restarts > restarts_before:
        return f"systemd restarted its process {restarts - restarts_before} time(s) while we waited (crash loop)"
    if active == "inactive":
        return "the unit is not running (its process exited)"
    return ""


def summary(props: Mapping[str, str]) -> str:
    """The unit's state in one line, with how its main process ended, if it did."""
    words = [f"{key}={props[key]}" for key in ("ActiveState", "SubState", "Result", "NRestarts") if key in props]
    code, status = props.get("ExecMainCode", ""), props.get("ExecMainStatus", "")
    if code == _EXITED:
        words.append(f"exit status {status}")
    elif code in (_KILLED, _DUMPED):
        words.append(f"killed by signal {status}" + (" (core dumped)" if code == _DUMPED else ""))
    if _int(props.get("MainPID", "0")) > 0:
        words.append(f"MainPID={props['MainPID']}")
    return " ".join(words)


def get_status(url: str, api_key: str | None, timeout: int) -> tuple[int, str]:
    """(HTTP status, a few words); -1 when nothing answered."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, f"HTTP {answer.status}"
    except urllib.error.HTTPError as err:
        return err.code, f"HTTP {err.code} {err.reason}"
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return -1, f"no answer ({reason})"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "unit": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "timeout": {"type": "int", "default": 30},
            "restarts_before": {"type": "int", "default": -1},
        },
        supports_check_mode=True,
    )
    params = module.params
    status, said = get_status(params["url"], params["api_key"], params["timeout"])
    systemctl = module.get_bin_path("systemctl", required=True)
    rc, out, err = module.run_command([systemctl, "show", "-p", ",".join(PROPERTIES), "--", params["unit"]])
    props = parse_show(out) if rc == 0 else {}
    healthy = status == 200
    reason = "" if healthy or rc != 0 else verdict(props, params["restarts_before"])
    module.exit_json(
        changed=False,
        status=status,
        healthy=healthy,
        gave_up=bool(reason),
        reason=reason,
        unit_state=props,
        unit_summary=summary(props) if rc == 0 else f"systemctl show failed: {err.strip()}",
        msg=said,
    )


if __name__ == "__main__":
    main()
