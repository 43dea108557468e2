"""Filters of the sglang_service role: the checks of its config, before anything on a host changes.

The one implementation of these checks. The role runs them in its entry point ``validate`` (imported
by ``stage``: it fails at once with every finding) and ``check`` (the preflight role calls it and lists
the findings with its own). A finding is one string that says what is wrong, names the variable and
says how to fix it; it never echoes a key.

- ``sglang_service_config_findings(plan, instances, table, settings)``: the rendered plan against
  SGLang 0.5.23's own flag table (files/sglang-flags.json, read off its argparse parser by
  files/dump_sglang_flags.py): unknown and ambiguous flags, values, types, choices and the ranges
  argparse leaves to later; names, ports, profiles, public bind without a key, TP size vs the GPUs,
  HiCache and L3 rules.
- ``sglang_service_argv_findings(argv, table, ranges)``: one argv against the flag table.
- ``sglang_service_input_findings(inputs)``: every input's type, range and charset (control
  characters anywhere, names, env names, device specs, syscall groups, IP entries, groups,
  unit_extra directives, paths, secret flags in argv, api keys, MemoryMax/TasksMax, the service user
  and group against the host's accounts).
- ``sglang_service_knob_findings(knobs)``: this role's own check knobs in range.
- ``sglang_service_ram_findings(pools, memtotal_mb, reserve_gb, host)``: HiCache host pools vs RAM.
- ``sglang_service_mem_available_findings(pools, probe, reserve_gib, host)``: the pinned pools against
  MemAvailable with SGLang 0.5.23's own rule.
- ``sglang_service_port_findings(results)``: ports held by other processes (files/check_port.py).
- ``sglang_service_l3_disk_needs(plan, used)``: free disk the L3 tiers need (library/fleet_free_disk).
- ``sglang_service_instance_environments`` / ``sglang_service_instance_secrets``: inputs by variable path.
- ``sglang_service_plan_failure(result, action)``: the finding for a plan that failed.
- ``sglang_service_findings_message(findings, host, note)``: the one message per host.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain-Python use (unit tests without Ansible)
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]

# --- constants --------------------------------------------------------------------------------------
# Full-string matches (re.fullmatch): `$` would accept a trailing newline.
# Full-string matches (re.fullmatch): `$` would accept a trailing newline.
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,40}")

_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")

# Ranges SGLang's argparse does not check (its resolve step or the server does, on the host, later).
DEFAULT_RANGES: dict[str, dict[str, float]] = {
    "--port": {"min": 1, "max": 65535},
    "--tp-size": {"min": 1},
    "--tensor-parallel-size": {"min": 1},
    "--context-length": {"min": 1},
    "--mem-fraction-static": {"gt": 0, "lt": 1},
    "--max-running-requests": {"min": 1},
    "--chunked-prefill-size": {"min": -1},
    "--page-size": {"min": 1},
    "--stream-interval": {"min": 1},
    "--hicache-ratio": {"gt": 0},
    "--hicache-size": {"min": 0},
    "--hicache-host-memory-fraction": {"gt": 0, "max": 1},
    "--speculative-num-draft-tokens": {"min": 1},
}

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")

_ACCOUNT = re.compile(r"[a-z_][a-z0-9_-]{0,31}")

_PATH = re.compile(r"/[A-Za-z0-9._+@:/-]*")

_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.@\\-]{1,250}\.(service|target|mount|socket|device|path)")

_IFNAME = re.compile(r"[A-Za-z0-9_.:-]{0,15}")

_DEVICE = re.compile(r"(/dev/kfd|/dev/dri/renderD[0-9]{1,4}|/dev/dri/card[0-9]{1,4}|char-drm)( [rwm]{1,3})?")

_SYSCALL = re.compile(r"[a-z_][a-z0-9_]{0,63}")

_UNIT_LINE = re.compile(r"([A-Za-z][A-Za-z0-9]{0,63})=[^\x00-\x1f\x7f]*")

# systemd's MemoryMax=: bytes with an optional K/M/G/T suffix (base 1024), a whole percentage of RAM
# (1-100), or infinity. TasksMax=: a count, or infinity.
_MEMORY_BYTES = re.compile(r"([1-9][0-9]{0,18})([KMGT]?)")

_MEMORY_PERCENT = re.compile(r"(100|[1-9][0-9]?)%")

_TASKS = re.compile(r"[1-9][0-9]{0,9}")

_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}

# The role marks the account it creates with this GECOS comment (roles/sglang_service/tasks/user.yml);
# an existing account without it is someone else's, and the role would rewrite its shell, home, groups.
ACCOUNT_MARKER = "SGLang service"

# What ROCm's devices need (/dev/kfd and /dev/dri/renderD* belong to render and video).
SUPPLEMENTARY_GROUPS = ("render", "video")

# Syscall groups the service may be given (allow list; @privileged, @mount, @module, @raw-io, @debug,
# @reboot, @swap, @cpu-emulation, @obsolete, @clock, @known are not among them).
SYSCALL_GROUPS = (
    "@system-service", "@default", "@basic-io", "@file-system", "@io-event", "@ipc", "@memlock",
    "@network-io", "@process", "@resources", "@signal", "@sync", "@timer", "@aio",
)

# Single calls never granted (they undo the sandbox or the host): as a group they are left out above.
SYSCALL_DENIED = frozenset(
    "mount umount umount2 pivot_root chroot ptrace process_vm_writev init_module finit_module delete_module "
    "kexec_load kexec_file_load reboot swapon swapoff setuid setgid setreuid setregid setresuid setresgid "
    "setfsuid setfsgid setgroups capset bpf open_by_handle_at name_to_handle_at iopl ioperm acct "
    "settimeofday clock_settime clock_adjtime adjtimex quotactl unshare setns fsopen fsmount move_mount "
    "open_tree keyctl add_key request_key perf_event_open userfaultfd".split()
)

IP_WORDS = ("localhost", "link-local", "multicast")

# [Service] directives sglang_service_unit_extra may not set unless sglang_service_unit_extra_unsafe is
# true: identity, sandbox, exec, network, paths, environment (prefix match on the directive name).
UNSAFE_DIRECTIVES = re.compile(
    r"(User|Group|DynamicUser|SupplementaryGroups|PAMName|Protect\w*|Private\w*|NoNewPrivileges|Capability\w*"
    r"|AmbientCapabilities|SecureBits|Exec\w*|IPAddress\w*|IPIngress\w*|IPEgress\w*|SocketBind\w*"
    r"|RestrictNetworkInterfaces|NetworkNamespacePath|IPCNamespacePath"
    r"|ReadWritePaths|ReadOnlyPaths|InaccessiblePaths|ExecPaths|NoExecPaths|BindPaths|BindReadOnlyPaths"
    r"|TemporaryFileSystem|RootDirectory|RootImage\w*|MountImages|ExtensionImages|ExtensionDirectories"
    r"|MountAPIVFS|MountFlags|WorkingDirectory|RootDirectoryStartOnly|\w+Directory|\w+DirectoryMode"
    r"|SystemCall\w*|Restrict\w*|LockPersonality|MemoryDenyWriteExecute|RemoveIPC|KeyringMode|UMask"
    r"|Device\w*|Environment\w*|PassEnvironment|UnsetEnvironment|LoadCredential\w*|SetCredential\w*"
    r"|ImportCredential|SELinuxContext\w*|AppArmorProfile|SmackProcessLabel|NotifyAccess|Type"
    r"|Delegate\w*|BPFProgram|Personality)"
)

SECRET_FLAGS = ("--api-key", "--admin-api-key", "--config")

# Directives the unit sets from a role variable: a second one in sglang_service_unit_extra would override
# it behind the variable's back (systemd takes the last), so it is refused, naming the variable.
OWNED_DIRECTIVES = {
    "MemoryMax": "sglang_service_memory_max",
    "TasksMax": "sglang_service_tasks_max",
    "LimitNOFILE": "sglang_service_limit_nofile",
    "LimitMEMLOCK": "nothing (the pinned HiCache host pool needs LimitMEMLOCK=infinity, which the unit sets)",
}

_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f]")
_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0", "y", "n", "t", "f"}


# --- inputs: type, range and charset -----------------------------------------------------------------
def _control(text: str) -> str | None:
    """The first control character of text, escaped (\\n, \\x00), and its position; None without one."""
    match = _CONTROL.search(text)
    if not match:
        return None
    return f"{match.group().encode('unicode_escape').decode()} at position {match.start()}"

def _walk(name: str, value: Any, skip: Sequence[str] = ()) -> list[str]:
    """Control characters in any string (or mapping key) of value, by its path (values never shown)."""
    found: list[str] = []
    if isinstance(value, str):
        where = _control(value)
        if where:
            found.append(
                f"{name} contains a control character ({where}): a newline in a value that reaches a systemd unit, "
                "an env file or a path adds lines of its own. Remove it (a YAML block scalar `|` or a trailing "
                "newline from a file lookup adds one)."
            )
    elif isinstance(value, Mapping):
        for key, item in value.items():
            label = f"{name}[{key!r}]"
            if isinstance(key, str) and _control(key):
                found.append(f"{name} has a key with a control character ({_control(key)}); remove it.")
                label = f"{name}[<key with a control character>]"
            if key in skip:
                continue
            found += _walk(label, item, skip)
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        for index, item in enumerate(value):
            found += _walk(f"{name}[{index}]", item, skip)
    return found

def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return [value]
    return list(value)

def _secret_flag(flag: Any) -> str | None:
    key = str(flag).split("=", 1)[0].strip()
    if len(key) < 5 or not key.startswith("--"):
        return None
    return next((secret for secret in SECRET_FLAGS if secret.startswith(key)), None)

def _args_sources(inputs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    sources: list[tuple[str, Any]] = []
    for name, profile in (inputs.get("profiles") or {}).items():
        sources.append((f"sglang_service_profiles[{name!r}]", profile))
    sources.append(("sglang_service_hicache_args", inputs.get("hicache_args")))
    for index, instance in enumerate(_list(inputs.get("instances"))):
        if isinstance(instance, Mapping):
            sources.append((f"sglang_service_instances[{index}].args", instance.get("args")))
            sources.append((f"sglang_service_instances[{index}].hicache_args", instance.get("hicache_args")))
    return sources

def _getent(text: Any) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """passwd and group entries of `getent passwd ...; echo --; getent group ...` output."""
    passwd: dict[str, list[str]] = {}
    group: dict[str, list[str]] = {}
    target = passwd
    for line in str(text or "").splitlines():
        if line.strip() == "--":
            target = group
            continue
        fields = line.split(":")
        if len(fields) >= 3 and fields[0]:
            target[fields[0]] = fields[1:]
    return passwd, group

def _account_findings(inputs: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    user, group = str(inputs.get("user") or ""), str(inputs.get("group") or "")
    for variable, name in (("sglang_service_user", user), ("sglang_service_group", group)):
        if not _ACCOUNT.fullmatch(name):
            found.append(
                f"{variable} = {name!r} is not a valid account name; use lowercase letters, digits, '_' and '-' "
                "(at most 32 characters, starting with a letter or '_'), e.g. sglang."
            )
    if found or inputs.get("accounts") is None:
        return found
    passwd, groups = _getent(inputs.get("accounts"))
    connecting = {str(name) for name in _list(inputs.get("connecting_users")) if name}
    entry = passwd.get(user)
    fix = "set sglang_service_user to a new name (the role creates it), e.g. sglang"
    if user == "root" or (entry and len(entry) >= 2 and entry[1] == "0"):
        found.append(f"sglang_service_user = {user!r} is root; the service never runs as root: {fix}.")
    elif user in connecting:
        found.append(
            f"sglang_service_user = {user!r} is the account Ansible connects as; the role would rewrite its shell, "
            f"home and groups and lock you out: {fix}."
        )
    elif entry is not None and (len(entry) < 4 or entry[3] != ACCOUNT_MARKER):
        found.append(
            f"sglang_service_user = {user!r} is an existing account (uid {entry[1] if len(entry) > 1 else '?'}) the "
            f"role did not create (its GECOS comment is not {ACCOUNT_MARKER!r}); the role would rewrite its shell, "
            f"home and groups: {fix}."
        )
    gentry = groups.get(group)
    gfix = "set sglang_service_group to a new group of its own (the role creates it), e.g. sglang"
    if group == "root" or (gentry and len(gentry) >= 2 and gentry[1] == "0"):
        found.append(f"sglang_service_group = {group!r} is root's group; {gfix}.")
    elif gentry is not None:
        members = {member for member in (gentry[2] if len(gentry) > 2 else "").split(",") if member}
        ours = entry is not None and len(entry) >= 4 and entry[3] == ACCOUNT_MARKER and entry[2] == gentry[1]
        if not ours or members - {user}:
            found.append(
                f"sglang_service_group = {group!r} is an existing group the role did not create for "
                f"sglang_service_user {user!r}{' (members: ' + ', '.join(sorted(members)) + ')' if members else ''}: "
                f"every member could read what the service writes to its home (UMask 0027); {gfix} (if an earlier "
                "failed run left it, delete the group)."
            )
    return found

def service_input_findings(inputs: Mapping[str, Any]) -> list[str]:
    """The sglang_service inputs (the variables as the plan saw them); every problem at once.

    inputs: walk ({variable: value}, every value that reaches the unit, the env file or a path),
    profiles, profile, instances, hicache_args, environment ({variable: mapping}), device_allow,
    system_call_filter, ip_address_allow, ip_address_bind_prefix, supplementary_groups,
    read_write_paths, state_dir, dirs ({variable: path}), unit_extra, unit_extra_unsafe,
    driver_units, rank_interface, secrets ({variable: key}, never shown), user, group, accounts
    (getent output or None), connecting_users, memory_max, tasks_max, allow_kms_nodes, pools
    ({instance: GB of its HiCache host pool}), memtotal_mb (the host's RAM, or None).
    """
    found: list[str] = []
    for name, value in (inputs.get("walk") or {}).items():
        found += _walk(str(name), value, skip=("api_key", "admin_api_key"))

    profiles = inputs.get("profiles") or {}
    names = [("sglang_service_profiles (a profile's name)", p) for p in profiles]
    names.append(("sglang_service_profile", inputs.get("profile")))
    for index, instance in enumerate(_list(inputs.get("instances"))):
        if isinstance(instance, Mapping) and "profile" in instance:
            names.append((f"sglang_service_instances[{index}].profile", instance.get("profile")))
    for variable, name in names:
        if not isinstance(name, str) or not _PROFILE.fullmatch(name):
            found.append(
                f"{variable}: {name!r} is not a valid profile name; use letters, digits, '.', '_' and '-' "
                "(at most 64 characters, starting with a letter or digit)."
            )

    for variable, environment in (inputs.get("environment") or {}).items():
        for key in (environment or {}) if isinstance(environment, Mapping) else []:
            if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
                found.append(
                    f"{variable}: {key!r} is not a valid environment variable name; use letters, digits and '_' "
                    "(not starting with a digit)."
                )

    for index, device in enumerate(_list(inputs.get("device_allow"))):
        if not isinstance(device, str) or not _DEVICE.fullmatch(device):
            found.append(
                f"sglang_service_device_allow[{index}] = {device!r} is not an allowed device; the service may open "
                "only /dev/kfd, /dev/dri/renderD<N>, /dev/dri/card<N> or char-drm, each with access r, w and/or m "
                "(e.g. '/dev/kfd rw')."
            )

    for index, call in enumerate(_list(inputs.get("system_call_filter"))):
        text = str(call)
        if text in SYSCALL_GROUPS or (
            isinstance(call, str) and _SYSCALL.fullmatch(text) and text not in SYSCALL_DENIED
        ):
            continue
        found.append(
            f"sglang_service_system_call_filter[{index}] = {call!r} is not allowed; list groups of "
            f"{', '.join(SYSCALL_GROUPS)} or single system calls by name (no '~' deny lists, no ':errno', none of "
            "the privileged calls such as mount, ptrace, setuid or bpf)."
        )

    for index, entry in enumerate(_list(inputs.get("ip_address_allow"))):
        text = str(entry)
        if text in IP_WORDS:
            continue
        try:
            network = ipaddress.ip_network(text, strict=False) if isinstance(entry, str) else None
        except ValueError:
            network = None
        if network is None or network.prefixlen == 0 or not re.fullmatch(r"[0-9A-Fa-f.:/]+", text):
            found.append(
                f"sglang_service_ip_address_allow[{index}] = {entry!r} is not allowed; list addresses or CIDR "
                "networks with a prefix of at least /1 (no 'any', no /0), or localhost, link-local, multicast."
            )
    prefix = inputs.get("ip_address_bind_prefix")
    if prefix is not None:
        error = _range_finding("sglang_service_ip_address_bind_prefix", prefix, (8, 32, False, True))
        if error:
            found.append(error + " A /0 (or a short) prefix lets the whole internet reach the server.")

    allowed_groups = set(SUPPLEMENTARY_GROUPS)
    for index, group in enumerate(_list(inputs.get("supplementary_groups"))):
        if group not in allowed_groups:
            found.append(
                f"sglang_service_supplementary_groups[{index}] = {group!r} is not allowed; the service may join only "
                f"{', '.join(SUPPLEMENTARY_GROUPS)} (the GPU device groups). A group such as shadow, docker or adm "
                "gives it the host."
            )

    state_dir = str(inputs.get("state_dir") or "")
    for variable, path in (inputs.get("dirs") or {}).items():
        text = str(path)
        parts = text.split("/")[1:]
        if not _PATH.fullmatch(text) or text == "/" or any(part in ("", ".", "..") for part in parts):
            found.append(
                f"{variable} = {path!r} is not a plain absolute directory; use a path such as /var/lib/sglang "
                "(letters, digits, '._+@:-', no '.', '..' or empty components, not /)."
            )
    for index, path in enumerate(_list(inputs.get("read_write_paths"))):
        text = str(path)
        parts = text.split("/")[1:]
        plain = _PATH.fullmatch(text) and not any(part in ("", ".", "..") for part in parts)
        if not plain or not state_dir or not text.startswith(state_dir.rstrip("/") + "/"):
            found.append(
                f"sglang_service_read_write_paths[{index}] = {path!r} is outside the service's own state directory "
                f"({state_dir or 'sglang_service_state_dir'}/...); ProtectSystem=strict keeps the rest of the host "
                "read-only. List only plain paths under sglang_service_state_dir."
            )

    unsafe_ok = inputs.get("unit_extra_unsafe") is True
    for index, line in enumerate(_list(inputs.get("unit_extra"))):
        match = _UNIT_LINE.fullmatch(line) if isinstance(line, str) else None
        if not match:
            found.append(
                f"sglang_service_unit_extra[{index}] is not one `Directive=value` line (no section headers, "
                "comments or control characters); write e.g. CPUAffinity=0-15."
            )
        elif match.group(1) in OWNED_DIRECTIVES:
            found.append(
                f"sglang_service_unit_extra[{index}] sets {match.group(1)}=, which the unit already sets; a second "
                f"line would override it unseen. Drop it and set {OWNED_DIRECTIVES[match.group(1)]} instead."
            )
        elif UNSAFE_DIRECTIVES.fullmatch(match.group(1)) and not unsafe_ok:
            found.append(
                f"sglang_service_unit_extra[{index}] sets {match.group(1)}=, which changes the service's identity, "
                "sandbox, exec lines, network or paths; drop it, use the role's own variable for it, or set "
                "sglang_service_unit_extra_unsafe: true to take that responsibility."
            )

    for index, unit in enumerate(_list(inputs.get("driver_units"))):
        if not isinstance(unit, str) or not _UNIT_NAME.fullmatch(unit):
            found.append(
                f"sglang_service_driver_units[{index}] = {unit!r} is not a unit name; use e.g. modprobe@amdgpu.service."
            )
    interface = inputs.get("rank_interface")
    if interface is not None and (not isinstance(interface, str) or not _IFNAME.fullmatch(interface)):
        found.append(
            f"sglang_service_rank_interface = {interface!r} is not an interface name; use e.g. lo, or '' for none."
        )

    found += _limit_findings(inputs)
    if "allow_kms_nodes" in inputs:
        found += _bool_findings("sglang_service_allow_kms_nodes", inputs.get("allow_kms_nodes"))

    for source, args in _args_sources(inputs):
        for flag in args or {} if isinstance(args, Mapping) else []:
            secret = _secret_flag(flag)
            if secret:
                found.append(
                    f"{source} sets {flag} ({secret}): the api keys and the --config file belong in the secrets "
                    "file, never on a command line that ps shows. Remove it and set sglang_service_api_key / "
                    "sglang_service_admin_api_key (or the instance's api_key / admin_api_key), vaulted."
                )

    found += secret_findings(inputs.get("secrets") or {})
    found += _account_findings(inputs)
    return found

def _limit_findings(inputs: Mapping[str, Any]) -> list[str]:
    """MemoryMax= and TasksMax= of the units: values that parse, and a MemoryMax that holds the
    largest HiCache host pool an instance pins (`pools`: {instance: GB of 1e9 bytes}; a percentage
    against the host's RAM, `memtotal_mb`, when known)."""
    found: list[str] = []
    if "memory_max" in inputs:
        value = inputs.get("memory_max")
        text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
        limit = None
        if text == "infinity":
            pass
        elif _MEMORY_BYTES.fullmatch(text):
            number, suffix = _MEMORY_BYTES.fullmatch(text).groups()
            limit = int(number) * _SUFFIX[suffix]
        elif _MEMORY_PERCENT.fullmatch(text) and inputs.get("memtotal_mb") not in (None, ""):
            try:
                limit = int(text[:-1]) * int(inputs["memtotal_mb"]) * 1024 * 1024 // 100
            except (TypeError, ValueError):
                limit = None
        elif not _MEMORY_PERCENT.fullmatch(text):
            found.append(
                f"sglang_service_memory_max = {value!r} is not a systemd MemoryMax value; use bytes with a K, M, G "
                "or T suffix (e.g. 96G), a whole percentage of the host's RAM (e.g. '90%'), or infinity."
            )
        pools = inputs.get("pools") or {}
        for name, gb in (pools.items() if isinstance(pools, Mapping) else []):
            pool = _number(gb) or 0
            if text.endswith("%") and limit is not None and pool * 1e9 > int(inputs["memtotal_mb"]) * 1024 * 1024:
                continue  # a pool larger than the RAM itself: the RAM check names that
            if limit is not None and pool and limit < pool * 1e9:
                here = f"of this host's RAM ({limit / 1e9:.1f} GB)" if text.endswith("%") else f"({limit / 1e9:.1f} GB)"
                found.append(
                    f"sglang_service_memory_max = {value!r} {here} is smaller than the HiCache "
                    f"host pool instance {name} pins ({pool:g} GB, --tp-size x --hicache-size): the kernel would kill "
                    "it while it allocates the pool. Raise sglang_service_memory_max well above the pool (the weights "
                    "and torch need room too; e.g. '90%'), or lower --hicache-size."
                )
    if "tasks_max" in inputs:
        value = inputs.get("tasks_max")
        text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
        if text != "infinity" and not _TASKS.fullmatch(text):
            found.append(
                f"sglang_service_tasks_max = {value!r} is not a systemd TasksMax value; use a whole number of "
                "processes and threads (e.g. 8192) or infinity."
            )
    return found

def instance_environments(instances: Any) -> dict[str, Any]:
    """{"sglang_service_instances[i].environment": mapping} of each instance that has one."""
    return {
        f"sglang_service_instances[{index}].environment": instance.get("environment")
        for index, instance in enumerate(_list(instances))
        if isinstance(instance, Mapping) and instance.get("environment") is not None
    }

def instance_secrets(instances: Any, api_key: Any = "", admin_api_key: Any = "") -> dict[str, Any]:
    """{variable: key} of the fleet's and every instance's api keys (for secret_findings; never shown)."""
    secrets = {"sglang_service_api_key": api_key, "sglang_service_admin_api_key": admin_api_key}
    for index, instance in enumerate(_list(instances)):
        if isinstance(instance, Mapping):
            for field in ("api_key", "admin_api_key"):
                if field in instance:
                    secrets[f"sglang_service_instances[{index}].{field}"] = instance.get(field)
    return secrets

def plan_failure(result: Mapping[str, Any], action: Any) -> str:
    """The finding for a sglang_service plan that failed: its argument specs, or its rendering."""
    if action == "ansible.builtin.validate_argument_spec":
        errors = "; ".join(str(e) for e in result.get("argument_errors") or [])
        return (
            "the sglang_service config was not rendered or checked: its variables fail the argument specs of the "
            f"sglang_service role ({errors}); fix them in the inventory first."
        )
    message = " ".join(str(result.get("msg") or "the sglang_service plan failed").split())[:600]
    return f"the sglang_service config could not be rendered ({message}); fix the inputs named above first."

def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(float(value)) else None
    text = str(value)
    if re.fullmatch(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", text):
        return float(text)
    return None

def _range_finding(name: str, value: Any, rule: tuple[float, float, bool, bool]) -> str | None:
    low, high, low_open, integer = rule
    number = _number(value)
    kind = "a whole number" if integer else "a number"
    if number is None or (integer and not number.is_integer()):
        return f"{name} = {value!r} is not {kind}; set it to {kind} in {'(' if low_open else '['}{low:g}, {high:g}]."
    if (number <= low if low_open else number < low) or number > high:
        return (
            f"{name} = {value!r} is out of range; it must be {'>' if low_open else '>='} {low:g} and <= {high:g} "
            "(see the role's defaults for what it means)."
        )
    return None

def _bool_findings(name: str, value: Any) -> list[str]:
    if isinstance(value, bool) or value is None:
        return []
    if str(value).strip().lower() in _BOOL_WORDS:
        return []
    return [f"{name} = {value!r} is not a boolean; use true or false."]


def secret_findings(secrets: Mapping[str, Any]) -> list[str]:
    """Keys with whitespace or control characters (never shown): they break the header or the YAML."""
    found = []
    for variable, value in secrets.items():
        if value is None or value == "":
            continue
        if not isinstance(value, str) or _SPACE_OR_CONTROL.search(value):
            found.append(
                f"{variable} contains whitespace or a control character (the value is not shown); a key is one "
                "word. `echo key | ansible-vault encrypt_string` keeps echo's newline: use `printf %s key | "
                "ansible-vault encrypt_string --stdin-name ...` instead."
            )
    return found


# --- the rendered plan ------------------------------------------------------------------------------
def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None

def ram_findings(pools: Sequence[Mapping[str, Any]], memtotal_mb: Any, reserve_gb: Any, host: str = "") -> list[str]:
    """The HiCache host pools (pinned, GB = 1e9 bytes) plus the reserve must fit the host's RAM.

    pools: [{label, gb, variable}], e.g. {label: "main: 2 x 12 GB", gb: 24,
    variable: "sglang_service_hicache_args['--hicache-size']"}; sglang_service plan entries work too
    (host_pool_gb, host_pool_label).
    """
    pools = [
        {
            "label": pool.get("label", pool.get("host_pool_label", "")),
            "gb": float(pool.get("gb", pool.get("host_pool_gb", 0)) or 0),
            "variable": pool.get("variable", ""),
        }
        for pool in pools
    ]
    total = sum(pool["gb"] for pool in pools)
    if total <= 0:
        return []
    reserve = float(reserve_gb)
    ram_bytes = int(memtotal_mb) * 1048576
    if (total + reserve) * 1e9 <= ram_bytes:
        return []
    labels = " + ".join(" ".join(str(pool["label"]).split()) for pool in pools if pool["gb"] > 0)
    variables = sorted({str(pool["variable"]) for pool in pools if pool["variable"]})
    return [
        f"not enough RAM for the HiCache host pools: they need {total:g} GB of pinned RAM ({labels}; tp-size x "
        f"--hicache-size per instance) plus sglang_service_memory_reserve_gb = {reserve:g} GB, but "
        f"{host or 'the host'} has {ram_bytes / 1e9:.1f} GB ({memtotal_mb} MiB: MemTotal, or the RAM a simulator "
        "host was told). Lower "
        f"{' / '.join(variables) or '--hicache-size'}, lower tp-size, or run fewer instances here."
    ]

def mem_available_findings(
    pools: Sequence[Mapping[str, Any]], probe: Any, reserve_gib: Any, host: str = ""
) -> list[str]:
    """The pinned HiCache pools against MemAvailable, with SGLang 0.5.23's own rule.

    SGLang (srt/mem_cache/pool_host/base.py, host_memory_budget_bytes) admits a rank's pool when it
    fits (psutil's available memory, i.e. MemAvailable, bounded by the cgroup's headroom, minus
    HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 GiB) divided by the ranks on the host: all ranks together
    need sum(pools) + 10 GiB <= MemAvailable. probe: lines "MemAvailable <bytes>" and
    "<unit> <bytes>" (memory a unit of this plan holds now, minus its page cache; freed by its restart).
    """
    total = sum(float(pool.get("gb", pool.get("host_pool_gb", 0)) or 0) for pool in pools)
    if total <= 0:
        return []
    available, freed, units = None, 0, []
    for line in str(probe or "").splitlines():
        words = line.split()
        if len(words) != 2 or not words[1].isdigit():
            continue
        if words[0] == "MemAvailable":
            available = int(words[1])
        else:
            freed += int(words[1])
            units.append(words[0])
    if available is None:
        where = host or "the host"
        return [f"MemAvailable could not be read from /proc/meminfo on {where}; the HiCache pools are unchecked."]
    reserve = float(reserve_gib) * 1024**3
    usable = available + freed
    if total * 1e9 + reserve <= usable:
        return []
    labels = " + ".join(
        " ".join(str(pool.get("label", pool.get("host_pool_label", ""))).split())
        for pool in pools
        if float(pool.get("gb", pool.get("host_pool_gb", 0)) or 0) > 0
    )
    variables = sorted({str(pool["variable"]) for pool in pools if pool.get("variable")})
    running = f" + {freed / 1e9:.1f} GB held by {', '.join(units)} (freed by the restart)" if units else ""
    return [
        f"SGLang would refuse the HiCache host pools on {host or 'the host'}: they pin {total:g} GB ({labels}), and "
        f"SGLang admits them only within MemAvailable minus its own {float(reserve_gib):g} GiB reserve "
        f"(sglang_service_sglang_reserve_gib): {available / 1e9:.1f} GB available{running} - "
        f"{reserve / 1e9:.1f} GB = {(usable - reserve) / 1e9:.1f} GB. Lower "
        f"{' / '.join(variables) or '--hicache-size'}, lower tp-size, or free memory on the host."
    ]

def _looks_like_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NEGATIVE_NUMBER.fullmatch(token)

def _resolve(name: str, flags: Mapping[str, Any], abbrev: bool) -> tuple[str | None, str | None]:
    """(canonical flag, error)."""
    if name in flags:
        return name, None
    if abbrev and name.startswith("--"):
        matches = sorted(flag for flag in flags if flag.startswith(name))
        if len(matches) == 1:
            return matches[0], None
        if len(matches) > 1:
            return None, f"ambiguous option: {name} could match {', '.join(matches)}"
    return None, f"unrecognized arguments: {name}"

def _convert(flag: str, kind: str, raw: str, choices: Sequence[Any] | None) -> tuple[Any, str | None]:
    try:
        if kind == "int":
            value: Any = int(raw)
        elif kind == "float":
            value = float(raw)
        elif kind == "callable:loads":
            value = json.loads(raw)
        else:
            value = raw
    except ValueError:
        shown = "int" if kind == "int" else "float" if kind == "float" else kind.removeprefix("callable:")
        return None, f"argument {flag}: invalid {shown} value: {raw!r}"
    if choices is not None and value not in choices and str(value) not in [str(c) for c in choices]:
        listed = ", ".join(repr(c) for c in choices)
        return None, f"argument {flag}: invalid choice: {raw!r} (choose from {listed})"
    return value, None

def _in_range(flag: str, value: Any, rule: Mapping[str, float]) -> str | None:
    try:
        number = float(value)
        rule = {key: float(rule[key]) for key in ("min", "gt", "max", "lt") if key in rule}
    except (TypeError, ValueError):
        return None  # a bound that is no number is refused with sglang_service_flag_ranges itself
    bounds = []
    if "min" in rule and number < rule["min"]:
        bounds.append(f">= {rule['min']:g}")
    if "gt" in rule and number <= rule["gt"]:
        bounds.append(f"> {rule['gt']:g}")
    if "max" in rule and number > rule["max"]:
        bounds.append(f"<= {rule['max']:g}")
    if "lt" in rule and number >= rule["lt"]:
        bounds.append(f"< {rule['lt']:g}")
    if not bounds:
        return None
    return f"argument {flag}: {value} is out of range (must be {' and '.join(bounds)})"

def parse_argv(argv: Sequence[Any], table: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """argv parsed like SGLang's argparse parser: ({canonical flag: value}, errors)."""
    flags: Mapping[str, Any] = table.get("flags", {})
    abbrev = bool(table.get("allow_abbrev", True))
    words = [str(word) for word in argv]
    values: dict[str, Any] = {}
    errors: list[str] = []
    i = 0
    while i < len(words):
        token = words[i]
        if not _looks_like_flag(token):
            errors.append(f"unrecognized arguments: {token}")
            i += 1
            continue
        name, _, value = token.partition("=")
        inline = value if "=" in token else None
        canonical, error = _resolve(name, flags, abbrev)
        i += 1
        follow: list[str] = []
        while i + len(follow) < len(words) and not _looks_like_flag(words[i + len(follow)]):
            follow.append(words[i + len(follow)])
        if error:
            errors.append(error)
            i += len(follow)
            continue
        spec = flags[canonical]
        kind, nargs, choices = spec.get("kind", "str"), spec.get("nargs"), spec.get("choices")
        raws = [inline] if inline is not None else follow
        if kind == "switch" or nargs == 0:
            if inline is not None:
                errors.append(f"argument {canonical}: ignored explicit argument {inline!r}")
            taken: list[str] = []
            values[canonical] = True
        elif nargs in ("+", "*") or isinstance(nargs, int):
            if nargs == "+" and not raws:
                errors.append(f"argument {canonical}: expected at least one argument")
            if isinstance(nargs, int) and len(raws) < nargs:
                errors.append(f"argument {canonical}: expected {nargs} arguments")
            taken = raws if not isinstance(nargs, int) else raws[:nargs]
            converted = [_convert(canonical, kind, raw, choices) for raw in taken]
            errors += [err for _, err in converted if err]
            values[canonical] = [value for value, _ in converted]
        elif nargs == "?":
            taken = raws[:1]
            value, err = _convert(canonical, kind, taken[0], choices) if taken else (None, None)
            errors += [err] if err else []
            values[canonical] = value
        else:
            if not raws:
                errors.append(f"argument {canonical}: expected one argument")
                taken = []
            else:
                taken = raws[:1]
                value, err = _convert(canonical, kind, taken[0], choices)
                errors += [err] if err else []
                values[canonical] = value
        if inline is None:
            i += len(taken)
            extra = follow[len(taken):]
            if extra:
                errors.append(f"unrecognized arguments: {' '.join(extra)}")
                i += len(extra)
    return values, errors

def sglang_argv(argv: Sequence[Any], table: Mapping[str, Any], ranges: Mapping[str, Any] | None = None) -> list[str]:
    """Errors SGLang's parser would report for argv (argparse's wording), plus out-of-range values."""
    values, errors = parse_argv(argv, table)
    # `ranges` (sglang_service_flag_ranges) adds to the built-in table, never replaces it: both apply.
    for rules in (DEFAULT_RANGES, ranges or {}):
        for flag, value in values.items():
            rule = rules.get(flag)
            if not isinstance(rule, Mapping) or value is None:
                continue
            for item in value if isinstance(value, list) else [value]:
                error = _in_range(flag, item, rule)
                if error and error not in errors:
                    errors.append(error)
    return errors

def _loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return False

def _visible_devices(environment: Mapping[str, Any]) -> list[str] | None:
    for key in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        if key in environment and environment[key] is not None:
            return [part for part in str(environment[key]).split(",") if part.strip()]
    return None

def config_findings(
    plan: Sequence[Mapping[str, Any]],
    instances: Sequence[Mapping[str, Any]],
    table: Mapping[str, Any],
    settings: Mapping[str, Any],
) -> list[str]:
    """Every check of the rendered sglang_service plan that needs no host access.

    settings: profiles (names), ranges, draft_free_algorithms, draft_from_models (true: the models
    role will provide the draft path later, so an empty one is not an error yet), environment (the
    fleet's, merged before each instance's), gpus (GPU agents found, or None).
    """
    found: list[str] = []
    if not plan:
        return ["sglang_service_instances is empty: list at least one instance ({name, port})."]
    names = [str(entry.get("name")) for entry in plan]
    for name in sorted({n for n in names if names.count(n) > 1}):
        found.append(f"sglang_service_instances: the name {name!r} is used twice; give each instance its own name.")
    for name in names:
        if not _NAME.fullmatch(name):
            found.append(
                f"sglang_service_instances: the name {name!r} is not valid; use lowercase letters, digits, "
                "'-' and '_' (at most 41 characters)."
            )
    ports: dict[int, list[str]] = {}
    for entry in plan:
        port = _whole(entry.get("port"))
        if port is None or not 1 <= port <= 65535:
            found.append(
                f"{entry.get('unit')}: port {entry.get('port')!r} is out of range; set the instance's `port` in "
                "sglang_service_instances to 1-65535."
            )
        else:
            ports.setdefault(port, []).append(str(entry.get("name")))
    for port, owners in sorted(ports.items()):
        if len(owners) > 1:
            found.append(
                f"sglang_service_instances: port {port} is given to {', '.join(owners)}; give each instance its "
                "own `port`."
            )
    profiles = list(settings.get("profiles") or [])
    by_name = {str(item.get("name")): item for item in instances if isinstance(item, Mapping)}
    gpus = settings.get("gpus")
    for entry in plan:
        unit, profile, args = entry.get("unit"), entry.get("profile"), entry.get("args") or {}
        if not entry.get("profile_known", profile in profiles):
            found.append(
                f"{unit}: profile {profile!r} is not in sglang_service_profiles (known: {', '.join(profiles)}); "
                "set sglang_service_profile or the instance's `profile` to one of them."
            )
            continue
        hicache_in_profile = list(entry.get("profile_hicache_flags") or [])
        if hicache_in_profile:
            found.append(
                f"{unit}: profile {profile!r} carries HiCache flags {hicache_in_profile}; move them to "
                "sglang_service_hicache_args so that sglang_service_hicache_enabled toggles HiCache alone."
            )
        bind = str(entry.get("bind", ""))
        if not _loopback(bind) and not entry.get("api_key_set"):
            found.append(
                f"{unit}: binds {bind}, which is not a loopback address, without an api key; set "
                "sglang_service_api_key (vaulted) or the instance's api_key, or bind 127.0.0.1 "
                "(sglang_service_bind_address)."
            )
        where = (
            f"profile '{profile}' of sglang_service_profiles, sglang_service_hicache_args or the instance's `args`"
        )
        for error in sglang_argv(entry.get("argv") or [], table, settings.get("ranges")):
            found.append(f"{unit}: SGLang 0.5.23 would refuse its arguments: {error}. Fix it in {where}.")
        if entry.get("hicache") and str(args.get("--hicache-host-memory-mode", "")) == "buffer_only" and not args.get(
            "--hicache-storage-backend"
        ):
            found.append(
                f"{unit}: --hicache-host-memory-mode buffer_only requires a storage backend "
                "(--hicache-storage-backend): host memory is only a staging buffer and all cached data lives in "
                "storage. Set '--hicache-storage-backend' in sglang_service_hicache_args or use "
                "'--hicache-host-memory-mode: cache'."
            )
        algorithm = args.get("--speculative-algorithm")
        free = [str(a) for a in settings.get("draft_free_algorithms") or []]
        if algorithm not in (None, False, "") and str(algorithm) not in free:
            if not str(args.get("--speculative-draft-model-path") or "") and not settings.get("draft_from_models"):
                found.append(
                    f"{unit}: --speculative-algorithm {algorithm} needs --speculative-draft-model-path, which is "
                    "empty. Set sglang_service_draft_model_path (or models_draft_path from the models role), or "
                    "drop speculative decoding with `args: {--speculative-algorithm: null}`."
                )
        tp = _whole(args.get("--tp-size", args.get("--tensor-parallel-size", 1))) or 1
        environment = dict(settings.get("environment") or {})
        environment.update((by_name.get(str(entry.get("name"))) or {}).get("environment") or {})
        visible = _visible_devices(environment)
        if visible is not None and tp > len(visible):
            found.append(
                f"{unit}: --tp-size {tp} needs {tp} GPUs but HIP_VISIBLE_DEVICES={','.join(visible)} shows "
                f"{len(visible)}; list {tp} GPUs in the instance's `environment` or lower --tp-size."
            )
        if gpus is not None and tp > int(gpus):
            found.append(
                f"{unit}: --tp-size {tp} needs {tp} GPUs but rocminfo found {gpus} on this host; lower --tp-size "
                "(sglang_service_profiles / the instance's args) or fix preflight_expected_gpus and the host."
            )
    found.extend(l3_findings(plan))
    return found

def l3_findings(plan: Sequence[Mapping[str, Any]]) -> list[str]:
    """The L3 tier (sglang_service_l3_enabled, an instance's l3_enabled): it needs HiCache, a size limit
    > 0, an eviction ratio in (0, 1] (SGLang falls back to 0.9 silently otherwise), SGLang's `file`
    backend (not another --hicache-storage-backend), and a directory apart from every instance's
    state directory (its home, releases and caches)."""
    found: list[str] = []
    for entry in plan:
        unit, l3 = entry.get("unit"), entry.get("l3") or {}
        if entry.get("l3_requested") and not entry.get("hicache"):
            found.append(
                f"{unit}: the L3 tier (sglang_service_l3_enabled, or the instance's l3_enabled) needs HiCache, which "
                "is off for it; turn HiCache on (sglang_service_hicache_enabled / the instance's hicache_enabled) "
                "or set l3_enabled: false."
            )
        if not l3:
            continue
        size = l3.get("max_size_bytes")
        if not isinstance(size, int) or size <= 0:
            found.append(
                f"{unit}: the L3 tier needs a size limit; set sglang_service_l3_max_size_gb to the GB (1e9 bytes) "
                "its directory may hold (> 0), or turn the tier off (sglang_service_l3_enabled: false)."
            )
        try:
            ratio = float(l3.get("eviction_ratio"))
        except (TypeError, ValueError):
            ratio = -1.0
        if not 0.0 < ratio <= 1.0:
            found.append(
                f"{unit}: sglang_service_l3_eviction_ratio = {l3.get('eviction_ratio')!r} is not in (0, 1] (SGLang "
                "would use 0.9 instead, silently); set e.g. 0.9."
            )
        backend = (entry.get("args") or {}).get("--hicache-storage-backend")
        if backend not in (None, "file"):
            found.append(
                f"{unit}: the L3 tier is SGLang's `file` backend, but its args set --hicache-storage-backend "
                f"{backend}; drop that flag from sglang_service_hicache_args / the instance's args, or turn the "
                "tier off (sglang_service_l3_enabled: false)."
            )
        root = str(l3.get("root") or "").rstrip("/")
        for other in plan:
            state = str(other.get("state_dir") or "").rstrip("/")
            if root and state and (root == state or root.startswith(state + "/") or state.startswith(root + "/")):
                found.append(
                    f"{unit}: sglang_service_l3_dir = {root} overlaps the state directory of instance "
                    f"{other.get('name')} ({state}); point sglang_service_l3_dir elsewhere or rename the instance."
                )
    return list(dict.fromkeys(found))

def l3_disk_needs(plan: Sequence[Mapping[str, Any]], used: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Free disk the L3 tiers need (library/fleet_free_disk's needs): each instance's size limit less
    what its identity's directory already holds (`used`: registered `du -sb` results per plan entry;
    a directory not there yet holds nothing). Summed per filesystem by library/fleet_free_disk.py."""
    held: dict[str, int] = {}
    for result in used or []:
        words = str(result.get("stdout") or "").split()
        item = result.get("item") or {}
        if words and words[0].isdigit() and not result.get("rc"):
            held[str(item.get("name"))] = int(words[0])
    needs = []
    for entry in plan:
        l3 = entry.get("l3") or {}
        size = l3.get("max_size_bytes")
        if not l3.get("dir") or not isinstance(size, int) or size <= 0:
            continue
        gb = size / 1e9
        needs.append({
            "path": l3["dir"],
            "need_bytes": max(0, size - held.get(str(entry.get("name")), 0)),
            "what": (f"the L3 tier of {entry.get('name')} (sglang_service_l3_max_size_gb = {gb:.12g} GB, less what its "
                     "directory holds)"),
            "fix": "Free space on that filesystem, point sglang_service_l3_dir at a larger one or lower "
                   "sglang_service_l3_max_size_gb.",
        })
    return needs

def port_findings(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Ports held by other processes: registered results of check_port.py, one per instance."""
    found = []
    for result in results:
        if result.get("skipped") or result.get("rc", 0) == 0:
            continue
        entry = result.get("item") or {}
        try:
            conflicts = json.loads(result.get("stdout") or "{}").get("conflicts", [])
        except ValueError:
            conflicts = []
        held = "; ".join(f"{', '.join(c.get('processes', []))} listening on {c.get('listen')}" for c in conflicts)
        found.append(
            f"{entry.get('unit')}: port {entry.get('port')} on {entry.get('bind')} is taken by "
            f"{held or (result.get('stderr') or result.get('msg') or 'another process').strip()}; choose another "
            "`port` for this instance in sglang_service_instances or stop that process."
        )
    return found

# This role's own knobs: a value outside these switches a check off instead of setting it.
KNOB_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "sglang_service_memory_reserve_gb": (0, 100000, False, False),
    "sglang_service_sglang_reserve_gib": (0, 100000, False, False),
}


def knob_findings(knobs: Mapping[str, Any]) -> list[str]:
    """This role's check knobs (KNOB_RANGES) in range, and sglang_service_flag_ranges well formed."""
    found: list[str] = []
    for name, value in knobs.items():
        if name == "sglang_service_flag_ranges":
            found += _flag_range_findings(value)
            continue
        error = _range_finding(name, value, KNOB_RANGES[name]) if name in KNOB_RANGES else None
        if error:
            found.append(error + " The role's own settings cannot switch its checks off.")
    return found


def _flag_range_findings(ranges: Any) -> list[str]:
    if ranges is None:
        return []
    if not isinstance(ranges, Mapping):
        return [f"sglang_service_flag_ranges = {ranges!r} is not a mapping; use {{flag: {{min, max, gt, lt}}}}."]
    return [
        f"sglang_service_flag_ranges[{flag!r}] = {rule!r} is not {{min, max, gt, lt}} with numbers; these add to "
        "the built-in ranges, they never replace them."
        for flag, rule in ranges.items()
        if not isinstance(rule, Mapping)
        or any(key not in ("min", "max", "gt", "lt") or _number(bound) is None for key, bound in rule.items())
    ]


def findings_message(findings: Sequence[Any], host: str, note: str = "") -> str:
    """One message for every finding on a host, numbered, with what was (not) done."""
    items = [" ".join(str(item).split()) for item in findings if item]
    lines = [f"the sglang_service config has {len(items)} problem(s) on {host}{'; ' + note if note else ''}:"]
    lines += [f"  {number}. {item}" for number, item in enumerate(items, start=1)]
    return "\n".join(lines)


class FilterModule:
    """Jinja filters of the sglang_service role: the checks of its config."""

    def filters(self) -> dict[str, Any]:
        return {
            "sglang_service_config_findings": config_findings,
            "sglang_service_argv_findings": sglang_argv,
            "sglang_service_input_findings": service_input_findings,
            "sglang_service_knob_findings": knob_findings,
            "sglang_service_ram_findings": ram_findings,
            "sglang_service_mem_available_findings": mem_available_findings,
            "sglang_service_port_findings": port_findings,
            "sglang_service_l3_disk_needs": l3_disk_needs,
            "sglang_service_instance_environments": instance_environments,
            "sglang_service_instance_secrets": instance_secrets,
            "sglang_service_plan_failure": plan_failure,
            "sglang_service_findings_message": findings_message,
        }
