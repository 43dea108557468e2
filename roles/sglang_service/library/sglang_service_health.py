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
  - >-
    Also gives up, naming the variable to fix, when the health endpoint answers a redirect (never
    followed: the api key would go along), when the URL carries credentials (a
    sglang_service_health_path such as C(@host:22/)), or when the api key contains whitespace or a
    line break (the value is never shown). O(timeout) bounds the whole request, not only each read;
    no response body is read.
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
    description: Seconds the whole health request may take (connect, send, status line and headers).
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

import http.client
import socket
import threading
import urllib.parse
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


class Refused(Exception):
    """Waiting longer cannot help: the URL, the key or the answer is one the poll refuses."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _safe(text: object, limit: int = 200) -> str:
    """Text from the server or the URL with every control character replaced, cut to limit."""
    words = "".join(" " if ord(ch) < 32 or 127 <= ord(ch) < 160 or ch in "\u2028\u2029" else ch for ch in str(text))
    words = " ".join(words.split())
    return words[:limit] + ("…" if len(words) > limit else "")


def check_key(api_key: str | None) -> None:
    """A key that cannot go into a header as it is, refused naming its variables, never its value."""
    if api_key and any(ch.isspace() or not " " < ch < "\x7f" for ch in api_key):
        raise Refused(-1, "the api key (sglang_service_api_key or the instance's api_key) contains whitespace, a "
                          "line break or a character that is not printable ASCII, so it cannot be sent (the value "
                          "is not shown); a key written with `echo key | ansible-vault encrypt_string` ends in a "
                          "newline: encrypt it with `printf %s key | ansible-vault encrypt_string`")


def split_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of the health URL; Refused for one that names credentials (a health
    path like `@other-host:22/` turns the instance's address into them) or is no plain http(s) URL."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc
            or any(ch.isspace() or ord(ch) < 32 for ch in url)):
        raise Refused(-1, f"the health URL {_safe(url)} is not a plain http(s) URL of the instance (credentials, "
                          "spaces or no host); sglang_service_health_path must be a path that starts with /")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), path


def get_status(url: str, api_key: str | None, timeout: int) -> tuple[int, str]:
    """(HTTP status, a few words); -1 when nothing answered. No redirect is followed (Refused names
    it), no body is read, and timeout bounds the whole request, not only each read: a server that
    drips its headers a byte at a time is cut off when it passes."""
    check_key(api_key)
    scheme, host, port, path = split_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = cls(host, port, timeout=timeout)
    expired = threading.Event()
    timer = None
    try:
        conn.connect()
        sock = conn.sock

        def cut() -> None:
            expired.set()
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        timer = threading.Timer(timeout, cut)
        timer.daemon = True
        timer.start()
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        if expired.is_set():  # the cut ends the headers early: what was parsed is no answer
            return -1, f"no complete answer within {timeout} s"
        status, reason = answer.status, _safe(answer.reason, 60)
        if 300 <= status < 400:
            location = _safe(answer.getheader("Location") or "")
            raise Refused(status, f"the health endpoint answered HTTP {status}, a redirect"
                                  f"{f' to {location}' if location else ''}, which is never followed (the api key "
                                  "would go along); check sglang_service_health_path and what listens on the port")
        return status, f"HTTP {status}" + (f" {reason}" if status != 200 and reason else "")
    except (OSError, http.client.HTTPException) as err:
        if expired.is_set():
            return -1, f"no complete answer within {timeout} s"
        return -1, f"no answer ({_safe(err)})"
    finally:
        if timer is not None:
            timer.cancel()
        conn.close()


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
    refused = ""
    try:
        status, said = get_status(params["url"], params["api_key"], params["timeout"])
    except Refused as exc:
        status, said, refused = exc.status, exc.reason, exc.reason
    systemctl = module.get_bin_path("systemctl", required=True)
    rc, out, err = module.run_command([systemctl, "show", "-p", ",".join(PROPERTIES), "--", params["unit"]])
    props = parse_show(out) if rc == 0 else {}
    healthy = status == 200 and not refused
    reason = refused or ("" if healthy or rc != 0 else verdict(props, params["restarts_before"]))
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
