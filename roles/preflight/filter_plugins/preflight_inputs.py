"""Filters of the preflight role: every input's type, range and charset, before any host changes.

Issue 24 ("No way in"). A value that reaches a systemd unit, an env file, a path or an HTTP header is
checked here, on the controller, with full-string matches (``re.fullmatch``; never ``$``, which
accepts a trailing newline). Each finding names the variable and the fix and never echoes a key.

- ``preflight_service_input_findings(inputs)``: the sglang_service inputs (called from
  ``tasks/service.yml``, so preflight's run and sglang_service's stage both check them): control
  characters anywhere, profile and instance names, env names, device specs, syscall groups, IP
  entries, supplementary groups, unit_extra directives, read_write_paths, directories, secret flags
  in argv, api keys, MemoryMax/TasksMax (a MemoryMax below an instance's host pool), and the service
  user and group against the host's accounts (``getent``).
- ``preflight_instance_environments(instances)`` / ``preflight_instance_secrets(instances, key, admin)``:
  the instances' environments and keys by variable path, for the two above.
- ``preflight_plan_failure(result, action)``: the finding for a sglang_service plan that failed.
- ``preflight_models_plan_findings(result, action)``: the findings of a models plan that failed (each
  problem it names: a manifest path, a link out of sync_src, a manifest file that cannot be read).
- ``preflight_run_input_findings(inputs)``: the rollout gate's thresholds and booleans, preflight's
  own knobs, the inventory host name (it becomes a report path), the ROCm key URL, the router key.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f]")
_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_ACCOUNT = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_PATH = re.compile(r"/[A-Za-z0-9._+@:/-]*")
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.@\\-]{1,250}\.(service|target|mount|socket|device|path)")
_IFNAME = re.compile(r"[A-Za-z0-9_.:-]{0,15}")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_DEVICE = re.compile(r"(/dev/kfd|/dev/dri/renderD[0-9]{1,4}|/dev/dri/card[0-9]{1,4}|char-drm)( [rwm]{1,3})?")
_SYSCALL = re.compile(r"[a-z_][a-z0-9_]{0,63}")
_UNIT_LINE = re.compile(r"([A-Za-z][A-Za-z0-9]{0,63})=[^\x00-\x1f\x7f]*")
# systemd's MemoryMax=: bytes with an optional K/M/G/T suffix (base 1024), a whole percentage of RAM
# (1-100), or infinity. TasksMax=: a count, or infinity.
_MEMORY_BYTES = re.compile(r"([1-9][0-9]{0,18})([KMGT]?)")
_MEMORY_PERCENT = re.compile(r"(100|[1-9][0-9]?)%")
_TASKS = re.compile(r"[1-9][0-9]{0,9}")
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0", "y", "n", "t", "f"}

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

# Gate thresholds: (min, max, min exclusive, integer). Outside them a gate passes everything, fails
# everything or runs for hours after the restart.
PROBE_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "rollout_probe_input_len_canary": (1, 2_000_000, False, True),
    "rollout_probe_input_len": (1, 2_000_000, False, True),
    "rollout_probe_cold_output_len": (1, 32768, False, True),
    "rollout_probe_warm_output_len": (1, 32768, False, True),
    "rollout_probe_repeats": (1, 20, False, True),
    "rollout_probe_ready_timeout": (1, 86400, False, True),
    "rollout_probe_flush_timeout": (1, 3600, False, True),
    "rollout_probe_request_timeout": (1, 86400, False, True),
    "rollout_probe_max_warm_cold_ratio": (0, 1, True, False),
    "rollout_probe_min_cached_fraction": (0, 1, False, False),
    "rollout_probe_min_host_cached_fraction": (0, 1, False, False),
    "rollout_probe_max_regression": (0, 100, False, False),
    "rollout_probe_regression_slack_ms": (0, 600000, False, False),
    "rollout_probe_max_warm_ttft_s": (0, 3600, True, False),
    "rollout_probe_seed": (0, 2**31 - 1, False, True),
    "rollout_probe_parity_tokens": (0, 4096, False, True),
    "rollout_probe_parity_logprob_tolerance": (0, 100, False, False),
}
# preflight's own knobs: a value outside these switches a check off instead of setting it.
KNOB_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "preflight_memory_reserve_gb": (0, 100000, False, False),
    "preflight_sglang_host_reserve_gib": (0, 100000, False, False),
    "preflight_expected_gpus": (0, 64, False, True),
    "preflight_rocm_disk_gb": (0, 100000, False, False),
    "preflight_rocm_debs_disk_gb": (0, 100000, False, False),
    "preflight_venv_disk_gb": (0, 100000, False, False),
    "preflight_models_disk_gb": (0, 100000, False, False),
    # The probe-pool rule's figures (0: the rule is off; a negative one would switch it off unsaid).
    "preflight_probe_device_tokens": (0, 10**9, False, True),
    "preflight_kv_bytes_per_token": (0, 10**9, False, True),
    "preflight_mamba_device_bytes": (0, 10**15, False, True),
}


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
                continue  # a pool larger than the RAM itself: preflight's RAM check names that
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


def _bool_findings(name: str, value: Any) -> list[str]:
    if isinstance(value, bool) or value is None:
        return []
    if str(value).strip().lower() in _BOOL_WORDS:
        return []
    return [f"{name} = {value!r} is not a boolean; use true or false."]


def run_input_findings(inputs: Mapping[str, Any]) -> list[str]:
    """The gate's thresholds and booleans, preflight's knobs, the host name, the ROCm key URL, the router key.

    inputs: probe ({variable: value}), booleans ({variable: value}), knobs ({variable: value}),
    ranges (preflight_sglang_ranges), host (inventory_hostname), rocm_key_url (or rocm_repo_base_url, from
    which the rocm role derives it), router_url (rollout_router_url), secrets.
    """
    found: list[str] = []
    for name, value in (inputs.get("probe") or {}).items():
        rule = PROBE_RANGES.get(name)
        if rule is None or (name == "rollout_probe_max_warm_ttft_s" and value in (None, "", "None")):
            continue
        error = _range_finding(name, value, rule)
        if error:
            found.append(error)
    for name, value in (inputs.get("booleans") or {}).items():
        found += _bool_findings(name, value)
    for name, value in (inputs.get("knobs") or {}).items():
        error = _range_finding(name, value, KNOB_RANGES[name]) if name in KNOB_RANGES else None
        if error:
            found.append(error + " preflight's own settings cannot switch its checks off.")
    ranges = inputs.get("ranges")
    if ranges is not None and not isinstance(ranges, Mapping):
        found.append(f"preflight_sglang_ranges = {ranges!r} is not a mapping; use {{flag: {{min, max, gt, lt}}}}.")
    for flag, rule in (ranges or {}).items() if isinstance(ranges, Mapping) else []:
        if not isinstance(rule, Mapping) or any(
            key not in ("min", "max", "gt", "lt") or _number(bound) is None for key, bound in rule.items()
        ):
            found.append(
                f"preflight_sglang_ranges[{flag!r}] = {rule!r} is not {{min, max, gt, lt}} with numbers; these add to "
                "the built-in ranges, they never replace them."
            )
    host = inputs.get("host")
    if host is not None and not _HOST.fullmatch(str(host)):
        found.append(
            f"the inventory host name {host!r} is not safe in a file name (it names the host's report files); use "
            "letters, digits, '.', '_' and '-', starting with a letter or digit, and set ansible_host for the address."
        )
    url = inputs.get("rocm_key_url")
    base = inputs.get("rocm_repo_base_url")
    if url in (None, "", "None") and base not in (None, "", "None"):
        url = f"{base}/rocm/rocm.gpg.key"  # the rocm role's default, from the inventory's base URL
    https = isinstance(url, str) and re.fullmatch(r"https://[^\s\x00-\x1f\x7f]+", url)
    if url not in (None, "", "None") and not https:
        shown = re.sub(r"://[^/@]*@", "://", str(url))  # a mirror's user:password is not repeated
        found.append(
            f"rocm_amd_key_url = {shown!r} is not an https:// URL; the key that signs every ROCm package must come "
            "over TLS (set rocm_amd_key_url or rocm_amd_repo_base_url to https://...)."
        )
    found += _router_url_findings(inputs.get("router_url"))
    found += secret_findings(inputs.get("secrets") or {})
    return found


def _router_url_findings(url: Any) -> list[str]:
    """rollout_router_url: "" (no router) or http(s)://HOST:PORT, without user:password@ (the router's key is
    rollout_router_api_key, sent as a header by no_log tasks; a URL is printed, logged and reported)."""
    if url in (None, "", "None"):
        return []
    text = str(url)
    shown = re.sub(r"://[^/@]*@", "://", text)  # user:password is not repeated
    if re.fullmatch(r"https?://[^/@\s\x00-\x1f\x7f]+@[^/\s\x00-\x1f\x7f]+/?", text):
        return [
            f"rollout_router_url = {shown!r} carries a user:password@; a URL is printed and written into reports, so "
            "leave credentials out of it and put the router's key in rollout_router_api_key (vault)."
        ]
    if not re.fullmatch(r"https?://[^/@\s\x00-\x1f\x7f]+/?", text):
        return [
            f"rollout_router_url = {shown!r} is not a router base URL; set it to http://HOST:PORT (the sglang-router's "
            'address), or to "" for no router.'
        ]
    return []


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


def models_plan_findings(result: Any, action: Any = "") -> list[str]:
    """Findings of the models plan (roles/models, entry point check): its ``models_plan_problems`` (a
    list, each naming its variable), or, for a plan that failed, its argument specs' errors or message."""
    if isinstance(result, list):
        return [f"{' '.join(str(problem).split())} (roles/models)" for problem in result]
    if action == "ansible.builtin.validate_argument_spec":
        errors = "; ".join(str(e) for e in result.get("argument_errors") or [])
        return [f"the models were not planned: their variables fail the argument specs of the models role ({errors}); "
                "fix them in the inventory first."]
    message = " ".join(str(result.get("msg") or "the models plan failed").split())[:600]
    return [f"the models could not be planned ({message}); fix models_main / models_draft first."]


class FilterModule:
    """Jinja filters of the preflight role: the inputs' type, range and charset."""

    def filters(self) -> dict[str, Any]:
        return {
            "preflight_service_input_findings": service_input_findings,
            "preflight_run_input_findings": run_input_findings,
            "preflight_instance_environments": instance_environments,
            "preflight_instance_secrets": instance_secrets,
            "preflight_plan_failure": plan_failure,
            "preflight_models_plan_findings": models_plan_findings,
        }
