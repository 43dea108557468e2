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
- ``sglang_service_launch_args(profile, hicache_args, hicache_on, overrides, bind, port)``: an
  instance's launch arguments: its profile, the HiCache args when HiCache is on, its own args, then
  ``--host``/``--port``.
- ``sglang_service_host_pool_gb(mapping, hicache=true)``: GB of pinned host RAM the HiCache pools take
  (0 with HiCache off).
- ``sglang_service_ip_allow(bind, router_url, extra, prefix, deny=true)``: the unit's IPAddressAllow
  entries (empty: no IP firewall, for a wildcard bind or with ``deny`` off).
- ``sglang_service_config_args(secrets_set, path)``: ``['--config', path]`` for an instance with a
  secrets file, ``[]`` without.
- ``sglang_service_protect_home(setting, home_paths)``: the unit's ProtectHome= (``auto`` resolved).
- ``sglang_service_secrets_digest(content, salt, secrets_set)``: the salted digest of a secrets file
  that goes into the config hash (``""`` without one).
- ``sglang_service_parse_refusal(result, python)``: the failure message of a check_args.py run.
- ``sglang_service_analyze_complaint(result, mine)``: the failure message of systemd-analyze verify.
- ``sglang_service_url_host(bind)``: a bind address as a URL's host (IPv6 in brackets).
- ``sglang_service_journal(result)``: a journalctl run's output, or why it failed.
- ``sglang_service_rank_interface_env(args, bind, interface)``: NCCL_SOCKET_IFNAME and
  GLOO_SOCKET_IFNAME for an instance with more than one rank bound to a loopback address.
- ``sglang_service_device_allow(devices, render_nodes, allow_kms)``: the unit's DeviceAllow values:
  the listed devices, one ``<node> rw`` per DRM render node the host has, ``char-drm rw`` only with
  ``allow_kms`` (it admits the KMS card nodes too).
- ``sglang_service_cache_directories(cache_root, release_id, user, group)``: a release's JIT cache
  directories with their owner and mode; ``sglang_service_rollback_cache_directories(previous, user,
  group)`` the same for the release a `previous` pointer's stat result names.
- ``sglang_service_prune_instances(plan)``: the plan as library/sglang_service_release.py's
  ``state: prune`` takes it (its rules are module_utils/sglang_service_release.py's).
- ``sglang_service_redact(text, secrets)``: text (or lines) with every secret replaced by
  ``<redacted>``, and any value SGLang prints after ``--api-key`` / ``api_key=`` too.
- ``sglang_service_l3_identity(args, sglang_release)``: the cache identity of an instance's L3 tier
  (SGLang's ``file`` storage backend): what KV pages written to disk depend on, and ``id``, a short hash
  of it that names the tier's directory.
- ``sglang_service_l3_args(args, on)``: the launch arguments with ``--hicache-storage-backend file``
  (before ``--host``) when the L3 tier is on.
- ``sglang_service_l3_directories(plan, user, group)``: the L3 directories with their owner and mode.
- ``sglang_service_exec_python(unit_text)``: the interpreter of a unit's ExecStart (its first word,
  unquoted as systemd does), e.g. the venv python of the unit kept in a release directory.
- ``sglang_service_argv_value(argv, flag)``: the value after ``flag`` in a release's argv.json, ``""``
  when absent or without a value.
- ``sglang_service_link_source(stat)``: where a release pointer links to, ``""`` when it is no link.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
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


def launch_args(
    profile: Mapping[str, Any],
    hicache_args: Mapping[str, Any],
    hicache_on: bool,
    overrides: Mapping[str, Any],
    bind: Any,
    port: Any,
) -> dict[str, Any]:
    """The profile's flags, updated by the HiCache args (when on), the instance's args, then --host/--port.

    A flag keeps the place where it first appears (as ``combine`` does); a later mapping only
    changes its value.
    """
    args = dict(profile)
    if hicache_on:
        args.update(hicache_args)
    args.update(overrides)
    args.update({"--host": bind, "--port": port})
    return args


def host_pool_gb(args: Mapping[str, Any], hicache: Any = True) -> int:
    """GB (1e9 bytes) of host RAM the HiCache pools of all TP ranks pin: tp-size × --hicache-size.

    0 when HiCache is off (`hicache` false), --hicache-size is absent, 0 (ratio sizing) or not a
    whole number (rejected elsewhere).
    """
    if not hicache:
        return 0
    size = _whole(args.get("--hicache-size", 0))
    tp = _whole(args.get("--tp-size", args.get("--tensor-parallel-size", 1)))
    if not size or not tp:
        return 0
    return size * tp


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
    # The L3 tier's identity and directory, only when it is on (a release without one is written as before).
    if instance.get("l3"):
        record["l3"] = dict(instance["l3"])
    return record


# The JIT caches of a release, under <state>/<name>/cache/<release id>/ (the unit's environment).
CACHE_SUBDIRS = ("xdg", "triton", "miopen-db", "miopen-cache")


def directories(plan: Sequence[Mapping[str, Any]], config_dir: str, state_dir: str, libexec_dir: str,
                user: str, group: str) -> list[dict[str, str]]:
    """Every directory the role keeps, in creation order: {path, owner, group, mode}. The config,
    state and helper directories are root's (0755); per instance, <state>/<name> is root's (0755), its
    releases root only (0700) and its home the service's (0750). The JIT caches: <state>/<name>/cache
    root's (0755, so the service cannot swap it for a link that prune would follow), the release's
    <cache>/<id> and its subdirectories the service's (0750): with the home, the only paths it may write."""
    dirs = [{"path": path, "owner": "root", "group": "root", "mode": "0755"}
            for path in (config_dir, state_dir, libexec_dir)]
    for instance in plan:
        dirs += [
            {"path": instance["state_dir"], "owner": "root", "group": "root", "mode": "0755"},
            {"path": instance["releases_dir"], "owner": "root", "group": "root", "mode": "0700"},
            {"path": instance["home_dir"], "owner": user, "group": group, "mode": "0750"},
        ]
        if instance.get("cache_dir"):
            dirs += cache_directories(instance["cache_root"], posixpath.basename(instance["cache_dir"]), user, group)
    return dirs


def cache_directories(cache_root: str, release_id: str, user: str, group: str) -> list[dict[str, str]]:
    """A release's JIT cache directories in creation order: <cache_root> (root, 0755), then
    <cache_root>/<release id> and its subdirectories (the service's, 0750)."""
    release = posixpath.join(str(cache_root), posixpath.basename(str(release_id).rstrip("/")))
    return ([{"path": str(cache_root), "owner": "root", "group": "root", "mode": "0755"}]
            + [{"path": path, "owner": user, "group": group, "mode": "0750"}
               for path in [release] + [posixpath.join(release, sub) for sub in CACHE_SUBDIRS]])


def rollback_cache_directories(previous: Mapping[str, Any], user: str, group: str) -> list[dict[str, str]]:
    """cache_directories of the release an instance's `previous` pointer names (its stat result)."""
    return cache_directories(previous["item"]["cache_root"], previous["stat"]["lnk_source"], user, group)


_RENDER_NODE = re.compile(r"/dev/dri/renderD[0-9]{1,4}")


def device_allow(devices: Sequence[Any], render_nodes: Sequence[Any], allow_kms: Any = False) -> list[str]:
    """DeviceAllow= values: `devices` as listed, then one ``<node> rw`` per DRM render node of the
    host (numeric order; anything not named /dev/dri/renderD<N> is left out), then ``char-drm rw``
    with `allow_kms` (the whole DRM class: the KMS card nodes /dev/dri/card* too). systemd's
    DeviceAllow takes no globs, so the render nodes are listed one by one. No entry twice."""
    entries = [str(device) for device in devices or []]
    nodes = sorted({str(node) for node in render_nodes or [] if _RENDER_NODE.fullmatch(str(node))},
                   key=lambda node: int(node.rsplit("D", 1)[1]))
    wanted = [f"{node} rw" for node in nodes] + (["char-drm rw"] if allow_kms else [])
    seen = set(entries)
    for entry in wanted:
        if entry not in seen:
            entries.append(entry)
            seen.add(entry)
    return entries


# --- L3 tier (SGLang's `file` storage backend) ---------------------------------------------------
# What SGLang 0.5.23 resolves when a flag is absent (its argparse defaults; --page-size None is one
# token per page, and a page_first layout with the direct io backend becomes page_first_direct,
# srt/arg_groups/hicache_hook.py resolve_layout_io_compatibility).
_L3_DEFAULTS = {"--dtype": "auto", "--kv-cache-dtype": "auto", "--page-size": 1, "--tp-size": 1, "--pp-size": 1,
                "--hicache-mem-layout": "page_first", "--hicache-io-backend": "kernel"}


def _flag(args: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = args.get(name)
        if value not in (None, False, ""):
            return value
    return _L3_DEFAULTS.get(names[0])


def l3_identity(args: Mapping[str, Any], sglang_release: Any) -> dict[str, Any]:
    """The cache identity of an instance's L3 tier: the model and draft revisions (their store paths
    name the manifest's sha256, roles/models), the SGLang release, the model dtype (what a KV dtype of
    `auto` follows), the KV dtype, page size, TP and PP size and the host memory layout the pages are
    written in, as SGLang resolves them when a flag is absent. ``id`` (16 hex digits of its sha256)
    names the directory: pages written under another identity are never read back as valid."""
    args = args or {}
    layout = str(_flag(args, "--hicache-mem-layout"))
    if layout == "page_first" and str(_flag(args, "--hicache-io-backend")) == "direct":
        layout = "page_first_direct"
    identity = {
        "model": str(args.get("--model-path") or ""),
        "draft": str(args.get("--speculative-draft-model-path") or ""),
        "sglang": str(sglang_release or ""),
        "dtype": str(_flag(args, "--dtype")),
        "kv_cache_dtype": str(_flag(args, "--kv-cache-dtype")),
        "page_size": _whole(_flag(args, "--page-size")) or 1,
        "tp_size": _whole(_flag(args, "--tp-size", "--tensor-parallel-size")) or 1,
        "pp_size": _whole(_flag(args, "--pp-size", "--pipeline-parallel-size")) or 1,
        "mem_layout": layout,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return {**identity, "id": digest[:16]}


def l3_args(args: Mapping[str, Any], on: Any) -> dict[str, Any]:
    """`args` with ``--hicache-storage-backend file`` before ``--host`` when the L3 tier is `on` (a
    backend the args already name stays: the role's checks refuse one other than ``file``)."""
    if not on or "--hicache-storage-backend" in (args or {}):
        return dict(args or {})
    out: dict[str, Any] = {}
    for key, value in (args or {}).items():
        if key == "--host":
            out["--hicache-storage-backend"] = "file"
        out[key] = value
    out.setdefault("--hicache-storage-backend", "file")
    return out


def l3_directories(plan: Sequence[Mapping[str, Any]], user: str, group: str) -> list[dict[str, str]]:
    """The L3 directories in creation order: the root and <root>/<name> root's (0755: the service
    cannot put a link there that prune would follow), <root>/<name>/<identity id> the service's,
    0700 (no other user, not even its group, reads the KV pages)."""
    dirs: list[dict[str, str]] = []
    seen: set[str] = set()
    for instance in plan:
        l3 = instance.get("l3") or {}
        if not l3.get("dir"):
            continue
        for path, owner, grp, mode in ((l3["root"], "root", "root", "0755"),
                                       (posixpath.dirname(l3["dir"]), "root", "root", "0755"),
                                       (l3["dir"], user, group, "0700")):
            if path not in seen:
                seen.add(path)
                dirs.append({"path": str(path), "owner": owner, "group": grp, "mode": mode})
    return dirs


def _nice_json(value: Any) -> str:
    """JSON as Ansible's to_nice_json writes it (indent 4, sorted keys, ASCII)."""
    return json.dumps(value, indent=4, sort_keys=True, separators=(",", ": "))


def release_instances(plan: Sequence[Mapping[str, Any]], python: str) -> list[dict[str, Any]]:
    """The plan as library/sglang_service_release.py takes it: each instance's live paths, its state,
    releases and release directories, what an adopted release records (unit name, bind, port) and the
    contents of its release files other than env and secrets (argv.json and release.json exactly as
    `to_nice_json` renders them, with a final newline)."""
    return [
        {
            "name": instance["name"],
            "unit_path": instance["unit_path"],
            "env_path": instance["env_path"],
            "secrets_path": instance["secrets_path"],
            "release_dir": instance["release_dir"],
            "unit": str(instance["unit_content"]),
            "argv_json": _nice_json(list(instance["launch_argv"])) + "\n",
            "release_json": _nice_json(release_record(instance, python)) + "\n",
            "state_dir": instance["state_dir"],
            "releases_dir": instance["releases_dir"],
            "staging_dir": instance["staging_dir"],
            # As "{{ check_argv | to_json }}\n" wrote it (json.dumps' own separators).
            "check_argv_json": json.dumps(list(instance["check_argv"])) + "\n",
            "unit_name": instance["unit"],
            "bind": instance["bind"],
            "port": int(instance["port"]),
            "dropin_dirs": list(instance.get("dropin_dirs") or []),
        }
        for instance in plan
    ]


def prune_instances(plan: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The plan as library/sglang_service_release.py takes it with ``state: prune``: each instance's
    state, releases and JIT cache directories and its planned L3 tier (``{}`` when off)."""
    return [{"name": instance["name"], "state_dir": instance["state_dir"], "releases_dir": instance["releases_dir"],
             "cache_root": instance["cache_root"], "l3": dict(instance.get("l3") or {})}
            for instance in plan]


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


def ip_allow(bind: Any, router_url: Any = "", extra: Any = (), prefix: Any = 24, deny: Any = True) -> list[str]:
    """IPAddressAllow= entries for an instance (with IPAddressDeny=any), in a stable order.

    None (and nothing checked) when `deny` is false: the unit has no IP firewall.

    Always `localhost`; a non-loopback bind address adds its network (`prefix` bits for IPv4, 64 for
    IPv6): the clients of a server bound to one interface are on that network. The router's address
    (an IP literal in `router_url`) and every entry of `extra` are added. A wildcard bind (0.0.0.0,
    ::) serves every network: no firewall (empty list) unless `extra` names the networks.
    """
    if not deny:
        return []
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


SECRET_KEYS = ("api_key", "admin_api_key")
SET = "(set)"


def instances_shown(instances: Any) -> Any:
    """The instances as a loop may show them at -v: each key (api_key, admin_api_key) given a
    non-empty value reads ``(set)``, an empty one stays empty (it turns the fleet's key off), so
    ``default(..., true)``/``length`` on it decide as on the real value. Anything else as it is."""
    if not isinstance(instances, Sequence) or isinstance(instances, (str, bytes)):
        return instances
    return [{key: (SET if value else value) if key in SECRET_KEYS else value for key, value in item.items()}
            if isinstance(item, Mapping) else item for item in instances]


def not_running(plan: Sequence[Mapping[str, Any]], current: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The plan's instances whose release directory is not the one they run now (`current`: instance
    name -> the release directory its `current` link points to, '' for none). tasks/verify.yml checks
    only these with SGLang: a running release was checked when it was installed."""
    return [dict(item) for item in plan if (current or {}).get(item["name"]) != item["release_dir"]]


def rollback_instances(previous: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The module's instances for state=rollback_secrets, from the stat results of each planned
    instance's `previous` pointer: its name and live file paths, and the release it points at."""
    return [{"name": result["item"]["name"], "release_dir": result["stat"]["lnk_source"],
             "secrets_path": result["item"]["secrets_path"], "unit_path": result["item"]["unit_path"],
             "env_path": result["item"]["env_path"], "unit": ""}
            for result in previous]


def config_args(secrets_set: Any, path: Any) -> list[Any]:
    """``['--config', path]`` when the instance has a secrets file (its api keys), else ``[]``."""
    return ["--config", path] if secrets_set else []


def protect_home(setting: Any, home_paths: Sequence[Any]) -> Any:
    """ProtectHome=: the setting, or for ``auto`` read-only when a path the unit runs is under /home, else yes."""
    if setting != "auto":
        return setting
    return "read-only" if len(home_paths) > 0 else "yes"


def secrets_digest(content: Any, salt: Any, secrets_set: Any) -> str:
    """sha256 of salt + secrets file content for an instance with a secrets file, else ``""``."""
    if not secrets_set:
        return ""
    return hashlib.sha256(f"{salt}{content}".encode()).hexdigest()


# The stand-in for a release's cache directory in the unit whose hash names the release (tasks/plan.yml).
RELEASE_ID_STANDIN = "release-id"


def unit_release(unit_for_hash: Any, instance: Mapping[str, Any], env_content: Any,
                 secrets_digest_: Any) -> dict[str, Any]:
    """The release of one instance from its unit rendered with the stand-in cache directory
    ``<cache_root>/release-id``: the config hash (sha256 of that unit, the env file and the secrets
    digest, as ``hash('sha256')`` takes it), the release and cache directories named by its first 12
    characters and ``unit_content``: the unit with the real cache directory in place of the stand-in,
    or None when that replacement is not exact.

    The template writes cache_dir only through sglang_service_systemd_quote. When cache_root is made
    of _PLAIN_WORD characters other than ``%`` (as the role's defaults are), that quoting leaves the
    stand-in path and the real one as they are and quotes a word for the same reasons with either,
    so replacing one path by the other gives exactly what rendering again with the real directory
    gives (tests/service/test_render.py). Otherwise tasks/plan.yml renders the unit again."""
    unit = str(unit_for_hash)
    config_hash = hashlib.sha256(f"{unit}{env_content}{secrets_digest_}".encode()).hexdigest()
    cache_root = str(instance["cache_root"])
    cache_dir = f"{cache_root}/{config_hash[:12]}"
    exact = bool(_PLAIN_WORD.match(cache_root)) and "%" not in cache_root
    return {
        "config_hash": config_hash,
        "release_dir": f"{instance['releases_dir']}/{config_hash[:12]}",
        "cache_dir": cache_dir,
        "unit_content": unit.replace(f"{cache_root}/{RELEASE_ID_STANDIN}", cache_dir) if exact else None,
    }


def _parsed(result: Mapping[str, Any]) -> Any:
    stdout = result.get("stdout", "")
    if not str(stdout).strip().startswith("{"):
        return {}
    try:
        return json.loads(str(stdout or "{}"))
    except ValueError as err:
        raise AnsibleFilterError(f"check_args.py printed no JSON: {err}") from None


def parse_refusal(result: Mapping[str, Any], python: Any) -> str:
    """Why SGLang refused a plan entry's arguments (check_args.py's result), as the task says it.

    SGLang not importable (the report's import_error) names the interpreter and the venv; a
    rejected flag names the profile, whether HiCache is on, and where to fix the flag. The detail is
    the report's message, else the run's stderr, else its msg (``no output`` without any).
    """
    entry = result["item"]
    report = _parsed(result)
    import_error = report.get("import_error", False)
    if import_error:
        what = f"SGLang is not importable with {python}"
        fix = "Install the venv (roles/sglang_venv) or set sglang_service_python."
    else:
        what = (f"SGLang rejects the launch arguments of profile {entry['profile']}"
                f" (HiCache {'on' if entry['hicache'] else 'off'})")
        fix = (f"Fix the flag in sglang_service_profiles[{entry['profile']}], sglang_service_hicache_args"
               " or the instance args.")
    detail = report.get("message") or (str(result.get("stderr", "")).strip() or result.get("msg", "no output"))
    return f"{entry['unit']}: {what}: {detail}. {fix} Nothing was installed; the running service was left alone."


def analyze_complaint(result: Mapping[str, Any], mine: Sequence[Any]) -> str:
    """What systemd-analyze verify said about the candidate unit: the lines naming it, else its stderr."""
    verdict = "failed" if result["rc"] != 0 else "warns"
    said = " | ".join(str(line) for line in mine) if len(mine) > 0 else str(result["stderr"]).strip()
    return (f"{result['item']['unit']}: systemd-analyze verify {verdict}: {said}. Fix the template input"
            " (sglang_service_unit_extra, sglang_service_device_allow, paths). Nothing was installed.")


def url_host(bind: Any) -> Any:
    """A bind address as the host part of a URL: an IPv6 address (it has a ':') in brackets."""
    return f"[{bind}]" if ":" in bind else bind


def journal(result: Mapping[str, Any]) -> Any:
    """A journalctl run's stdout when it ran (rc 0), else ``journalctl failed: <stderr>``."""
    if result.get("rc", 1) == 0:
        return result.get("stdout", "")
    return f"journalctl failed: {result.get('stderr', '')}"


# --- what a release runs (the entry point snapshot) ---------------------------------------------------
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", ";": ";", " ": " "}



def _first_word(line: str) -> str:
    """The first word of an ExecStart value, as systemd splits it (quotes, escapes, %% and $$)."""
    text = line.lstrip(" \t")
    while text[:1] in ("-", "@", ":", "+", "!"):  # systemd's ExecStart prefixes
        text = text[1:]
    word: list[str] = []
    quote = text[0] if text[:1] in ("'", '"') else None
    i = 1 if quote else 0
    while i < len(text):
        char = text[i]
        if quote and char == quote:
            break
        if not quote and char in " \t":
            break
        if char == "\\" and i + 1 < len(text):
            word.append(_ESCAPES.get(text[i + 1], text[i + 1]))
            i += 2
            continue
        if char in "%$" and text[i + 1 : i + 2] == char:
            i += 1
        word.append(char)
        i += 1
    return "".join(word)


def exec_python(unit_text: str) -> str:
    """The interpreter (first word) of the unit's ExecStart line."""
    for line in str(unit_text).splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "ExecStart" and value.strip():
            word = _first_word(value)
            if word:
                return word
    raise AnsibleFilterError("the unit has no ExecStart line with a command")


def argv_value(argv: Sequence[Any], flag: str) -> str:
    """The word after `flag` in argv (`--flag value`), or `--flag=value`; "" when absent."""
    words = [str(word) for word in argv]
    for index, word in enumerate(words):
        if word == flag:
            following = words[index + 1] if index + 1 < len(words) else ""
            return "" if following.startswith("--") else following
        if word.startswith(flag + "="):
            return word[len(flag) + 1 :]
    return ""


def link_source(stat: Mapping[str, Any]) -> Any:
    """A stat result's lnk_source when the path is a link, else ``""``."""
    return stat["lnk_source"] if stat.get("islnk", False) else ""


class FilterModule:
    """Jinja filters of the sglang_service role."""

    def filters(self) -> dict[str, Any]:
        return {
            "sglang_service_argv": argv,
            "sglang_service_exec_python": exec_python,
            "sglang_service_argv_value": argv_value,
            "sglang_service_link_source": link_source,
            "sglang_service_argv_groups": argv_groups,
            "sglang_service_systemd_quote": systemd_quote,
            "sglang_service_host_pool_gb": host_pool_gb,
            "sglang_service_prune_instances": prune_instances,
            "sglang_service_release_instances": release_instances,
            "sglang_service_directories": directories,
            "sglang_service_release_record": release_record,
            "sglang_service_env_quote": env_quote,
            "sglang_service_redact": redact,
            "sglang_service_ip_allow": ip_allow,
            "sglang_service_rank_interface_env": rank_interface_env,
            "sglang_service_launch_args": launch_args,
            "sglang_service_config_args": config_args,
            "sglang_service_instances_shown": instances_shown,
            "sglang_service_rollback_instances": rollback_instances,
            "sglang_service_not_running": not_running,
            "sglang_service_unit_release": unit_release,
            "sglang_service_protect_home": protect_home,
            "sglang_service_secrets_digest": secrets_digest,
            "sglang_service_parse_refusal": parse_refusal,
            "sglang_service_analyze_complaint": analyze_complaint,
            "sglang_service_url_host": url_host,
            "sglang_service_journal": journal,
            "sglang_service_device_allow": device_allow,
            "sglang_service_cache_directories": cache_directories,
            "sglang_service_rollback_cache_directories": rollback_cache_directories,
            "sglang_service_l3_identity": l3_identity,
            "sglang_service_l3_args": l3_args,
            "sglang_service_l3_directories": l3_directories,
        }
