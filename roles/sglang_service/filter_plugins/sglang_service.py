"""Filters of the sglang_service role: SGLang launch profiles to argv, argv to systemd syntax.

Plain functions (testable without Ansible) exposed as Jinja filters:

- ``sglang_service_argv(mapping)``: ``{flag: value}`` in mapping order to an argv list. ``true`` is a
  switch, ``false``/``null`` drop the flag, a list is an nargs flag (``--cuda-graph-bs-decode 1 2 4``),
  anything else is one value.
- ``sglang_service_argv_groups(mapping)``: the same, one list per flag (a flag and its values), so
  the unit can put each flag on its own continuation line.
- ``sglang_service_systemd_quote(word)``: one word in systemd's ExecStart syntax, so it reaches the
  process unchanged (spaces, quotes, backslashes, ``%`` specifiers, ``$`` expansion).
- ``sglang_service_env_quote(value)``: one value in EnvironmentFile syntax.
- ``sglang_service_host_pool_gb(mapping)``: GB of pinned host RAM the HiCache pools take.
- ``sglang_service_ip_allow(bind, router_url, extra, prefix)``: the unit's IPAddressAllow entries
  (empty: no IP firewall, for a wildcard bind).
- ``sglang_service_rank_interface_env(args, bind, interface)``: NCCL_SOCKET_IFNAME and
  GLOO_SOCKET_IFNAME for an instance with more than one rank bound to a loopback address.
- ``sglang_service_redact(text, secrets)``: text (or lines) with every secret replaced by
  ``<redacted>``, and any value SGLang prints after ``--api-key`` / ``api_key=`` too.
"""

from __future__ import annotations

import hashlib
import ipaddress
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain-Python use (unit tests without Ansible)
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]

_FLAG = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9-]*$")
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def _word(flag: str, value: Any) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, (Mapping, set)):
        raise AnsibleFilterError(
            f"SGLang flag {flag}: value {value!r} is not a scalar; "
            "use true for a switch, a list for an nargs flag, a string or a number otherwise"
        )
    text = str(value)
    if "\n" in text or "\r" in text or "\0" in text:
        raise AnsibleFilterError(f"SGLang flag {flag}: a value may not contain a newline or NUL")
    return text


def argv_groups(args: Mapping[str, Any]) -> list[list[str]]:
    """Launch arguments as one group per flag, in the mapping's order."""
    if not isinstance(args, Mapping):
        raise AnsibleFilterError(f"expected a mapping of SGLang flags, got {type(args).__name__}")
    groups: list[list[str]] = []
    for flag, value in args.items():
        if not isinstance(flag, str) or not _FLAG.match(flag):
            raise AnsibleFilterError(f"{flag!r} is not a long SGLang flag: write it as '--name' (e.g. '--tp-size')")
        if value is None or value is False:
            continue
        if value is True:
            groups.append([flag])
        elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            if not value:
                raise AnsibleFilterError(f"SGLang flag {flag}: an nargs list may not be empty")
            groups.append([flag] + [_word(flag, item) for item in value])
        else:
            groups.append([flag, _word(flag, value)])
    return groups


def argv(args: Mapping[str, Any]) -> list[str]:
    """Launch arguments as a flat argv list, in the mapping's order."""
    return [word for group in argv_groups(args) for word in group]


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def host_pool_gb(args: Mapping[str, Any]) -> int:
    """GB (1e9 bytes) of host RAM the HiCache pools of all TP ranks pin: tp-size × --hicache-size.

    0 when --hicache-size is absent, 0 (ratio sizing) or not a whole number (rejected elsewhere).
    """
    size = _whole(args.get("--hicache-size", 0))
    tp = _whole(args.get("--tp-size", args.get("--tensor-parallel-size", 1)))
    if not size or not tp:
        return 0
    return size * tp


def prune(
    found: Sequence[Mapping[str, Any]], keep: int, protect: Sequence[str], protect_ids: Sequence[str] = ()
) -> list[str]:
    """Release directories to delete: all but the `keep` newest (by mtime) and the protected ones.

    `protect` names directories by path; `protect_ids` by release id (a config hash, or its first 12
    characters, which is the directory's name).
    """
    ids = {str(i)[:12] for i in protect_ids if i}
    paths = set(protect)
    ordered = sorted(found, key=lambda entry: entry.get("mtime", 0), reverse=True)
    return [
        entry["path"]
        for entry in ordered[max(int(keep), 0) :]
        if entry["path"] not in paths and str(entry["path"]).rstrip("/").rsplit("/", 1)[-1] not in ids
    ]


def changing(
    candidates: Sequence[Sequence[Mapping[str, Any]]],
    env_contents: Mapping[str, str],
    secret_contents: Mapping[str, str] | None = None,
) -> list[str]:
    """Names of the instances whose live unit, env file or secrets file differs from the candidate.

    `candidates` is the plan zipped with the stat results (sha256 checksums) of the live unit and env
    file of each instance, and optionally of its secrets file. An instance without keys must have no
    secrets file; one with keys, a file with exactly the candidate's content.
    """
    names = []
    for instance, unit_stat, env_stat, *rest in candidates:
        unit_sum = (unit_stat.get("stat") or {}).get("checksum", "")
        env_sum = (env_stat.get("stat") or {}).get("checksum", "")
        want_unit = hashlib.sha256(str(instance["unit_content"]).encode()).hexdigest()
        want_env = hashlib.sha256(str(env_contents[instance["name"]]).encode()).hexdigest()
        differs = unit_sum != want_unit or env_sum != want_env
        if rest and secret_contents is not None:
            live = rest[0].get("stat") or {}
            want = str(secret_contents.get(instance["name"], "") or "")
            if want:
                differs = differs or live.get("checksum", "") != hashlib.sha256(want.encode()).hexdigest()
            else:
                differs = differs or bool(live.get("exists", False))
        if differs:
            names.append(instance["name"])
    return names


_RELEASE_KEYS = ("name", "unit", "bind", "port", "profile", "hicache", "api_key_set", "admin_api_key_set",
                 "secrets_set", "config_hash", "release_dir", "state_dir", "components")
_MODEL_FLAGS = ("--model-path", "--speculative-draft-model-path")


def release_record(instance: Mapping[str, Any], python: str) -> dict[str, Any]:
    """What a release is: the instance's address and config hash, and every path it runs from.

    `venv` is the venv release directory of the python (<venv>/bin/python); `model_paths` the model
    directories of its argv. Pruning of venvs and model revisions keeps whatever a kept release names.
    """
    record = {key: instance[key] for key in _RELEASE_KEYS if key in instance}
    record["port"] = int(record.get("port", 0))
    record["python"] = str(python)
    record["venv"] = posixpath.dirname(posixpath.dirname(str(python)))
    args = instance.get("args") or {}
    record["model_paths"] = [str(args[flag]) for flag in _MODEL_FLAGS if args.get(flag)]
    return record


def systemd_quote(word: Any) -> str:
    """Quote one ExecStart word so that systemd passes it to the process verbatim."""
    text = str(word)
    if "\n" in text or "\0" in text:
        raise AnsibleFilterError("a systemd ExecStart word may not contain a newline or NUL")
    # systemd expands %-specifiers everywhere and $VAR/${VAR} in ExecStart; double them.
    text = text.replace("%", "%%").replace("$", "$$")
    if text == ";":
        return "\\;"  # a lone ';' would separate commands
    if text and _PLAIN_WORD.match(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def env_quote(value: Any) -> str:
    """Quote one EnvironmentFile value (double quotes, backslash escapes)."""
    text = str(value)
    if "\n" in text or "\0" in text:
        raise AnsibleFilterError("an EnvironmentFile value may not contain a newline or NUL")
    for char in ("\\", '"', "$", "`"):
        text = text.replace(char, "\\" + char)
    return f'"{text}"'


_WILDCARDS = ("", "0.0.0.0", "::", "*")  # noqa: S104 (recognized, not bound)


def ip_allow(bind: Any, router_url: Any = "", extra: Any = (), prefix: Any = 24) -> list[str]:
    """IPAddressAllow= entries for an instance (with IPAddressDeny=any), in a stable order.

    Always `localhost`; a non-loopback bind address adds its network (`prefix` bits for IPv4, 64 for
    IPv6): the clients of a server bound to one interface are on that network. The router's address
    (an IP literal in `router_url`) and every entry of `extra` are added. A wildcard bind (0.0.0.0,
    ::) serves every network: no firewall (empty list) unless `extra` names the networks.
    """
    entries: list[str] = ["localhost"]
    bind_text = str(bind or "").strip("[]")
    wildcard = bind_text in _WILDCARDS
    if not wildcard and bind_text != "localhost":
        try:
            address = ipaddress.ip_address(bind_text)
        except ValueError as err:
            raise AnsibleFilterError(f"bind address {bind_text!r} is not an IP address: {err}") from None
        if not address.is_loopback:
            bits = int(prefix) if address.version == 4 else 64
            entries.append(str(ipaddress.ip_network(f"{address}/{bits}", strict=False)))
    host = re.sub(r"^[a-z]+://", "", str(router_url or "")).split("/", 1)[0]
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    try:
        router = ipaddress.ip_address(host) if host else None
    except ValueError:
        router = None  # a host name: name its address in sglang_service_ip_address_allow
    if router is not None and not router.is_loopback:
        entries.append(str(router))
    extras = [str(item) for item in (extra or [])]
    if wildcard and not extras:
        return []
    for item in extras:
        if item not in entries:
            entries.append(item)
    return entries


def _loopback(bind: Any) -> bool:
    text = str(bind or "").strip("[]")
    if text == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def rank_interface_env(args: Mapping[str, Any], bind: Any, interface: Any = "lo") -> dict[str, str]:
    """Environment that keeps the ranks' bootstrap on the loopback interface.

    RCCL (NCCL_SOCKET_IFNAME) and gloo (GLOO_SOCKET_IFNAME) otherwise pick the first non-loopback
    interface, whose addresses the unit's IPAddressAllow=localhost drops. Only for an instance bound
    to a loopback address with more than one rank (--tp-size x --pp-size > 1); empty `interface`
    turns it off.
    """
    if not interface or not _loopback(bind):
        return {}
    tp = _whole(args.get("--tp-size", args.get("--tensor-parallel-size", 1))) or 1
    pp = _whole(args.get("--pp-size", args.get("--pipeline-parallel-size", 1))) or 1
    if tp * pp <= 1:
        return {}
    return {"GLOO_SOCKET_IFNAME": str(interface), "NCCL_SOCKET_IFNAME": str(interface)}


REDACTED = "<redacted>"
# What SGLang itself prints with a key in it: its argv (`--api-key KEY`) and its ServerArgs
# (`api_key='KEY'`), also for a key the role no longer knows (a rolled-back release's).
# Also the --config YAML/JSON form (`api-key: KEY`, `"admin-api-key": "KEY"`).
_KEY_IN_LOG = re.compile(
    r"""(--(?:admin-)?api-key[= ]+|api_key=|(?:admin-)?api-key['"]?\s*:\s*)(['"]?)(?!<redacted>|None\b)[^\s'",)}]+"""
)


def redact(text: Any, secrets: Any) -> Any:
    """Replace every non-empty secret in text (a string or a list of lines) with ``<redacted>``.

    Longer secrets first, so a key that contains another key is not half-replaced. Values SGLang
    logs after ``--api-key``, ``--admin-api-key``, ``api_key=`` (``admin_api_key=``) or
    ``api-key:`` are redacted whether or not the role knows them.
    """
    if isinstance(text, Sequence) and not isinstance(text, (str, bytes)):
        return [redact(line, secrets) for line in text]
    if secrets is None:
        secrets = []
    elif isinstance(secrets, str) or not isinstance(secrets, Sequence):
        secrets = [secrets]
    result = "" if text is None else str(text)
    for secret in sorted({str(s) for s in secrets if s is not None and str(s) != ""}, key=len, reverse=True):
        result = result.replace(secret, REDACTED)
    return _KEY_IN_LOG.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", result)


class FilterModule:
    """Jinja filters of the sglang_service role."""

    def filters(self) -> dict[str, Any]:
        return {
            "sglang_service_argv": argv,
            "sglang_service_argv_groups": argv_groups,
            "sglang_service_systemd_quote": systemd_quote,
            "sglang_service_host_pool_gb": host_pool_gb,
            "sglang_service_prune": prune,
            "sglang_service_changing": changing,
            "sglang_service_release_record": release_record,
            "sglang_service_env_quote": env_quote,
            "sglang_service_redact": redact,
            "sglang_service_ip_allow": ip_allow,
            "sglang_service_rank_interface_env": rank_interface_env,
        }
