"""Filters of the preflight role: every check as a plain function that returns its findings.

A finding is one string that says what is wrong, names the variable and says how to fix it. The
role collects them per host and fails once with the list (``preflight_summary``). Each function is
the only implementation of its check: the sglang_service role reuses them through
``include_role: preflight, tasks_from: service | ram``. The free-disk check is the module
library/fleet_free_disk.py (module_utils/fleet_free_disk.py), which the models role calls too.

- ``preflight_host_findings(facts, settings)``: OS, init, Python, GPU agents (rocminfo).
- ``preflight_ram_findings(pools, memtotal_mb, reserve_gb, host)``: HiCache host pools vs RAM.
- ``preflight_sglang_argv(argv, table, ranges)``: argv against SGLang's own flag table
  (files/sglang-flags.json, read off its argparse parser): unknown and ambiguous flags, values,
  types, choices, plus ranges argparse does not check.
- ``preflight_service_findings(plan, instances, table, settings)``: the sglang_service plan: names,
  ports, profiles, public bind without a key, TP size vs GPUs, HiCache rules, probe prompt length.
- ``preflight_rollout_findings(settings)``: batches, probe settings, package set.
- ``preflight_port_findings(results)``: ports held by other processes (check_port.py output).
- ``preflight_kernel_findings(facts, settings)``: the running kernel against the ROCm release's list.
- ``preflight_secure_boot_findings(probe, settings)``: Secure Boot with AMD's DKMS amdgpu module.
- ``preflight_gpu_agents(rocminfo)`` / ``preflight_other_gpu_findings(rocminfo, settings)``: rocminfo's
  GPU agents; a GPU agent that is not the expected gfx target (an enabled iGPU).
- ``preflight_mem_available_findings(pools, probe, reserve_gib, host)``: the pinned pools against
  MemAvailable with SGLang 0.5.23's own rule.
- ``preflight_summary(findings, host)``: the one message per host.
- ``preflight_rocminfo(result, stderr=false)``: what the rocminfo run printed, none when it did not run.
- ``preflight_gpus_counted(rocminfo, arch, expected)``: the GPU agents found, none when rocminfo did
  not run or no GPU is expected.
- ``preflight_bytes_needed(gb, needed)``: GB as bytes (1e9) when the stage is needed, else 0.
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

# Full-string matches (re.fullmatch): `$` would accept a trailing newline.
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,40}")
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")
_PERCENT = re.compile(r"([0-9]+)%")
_HICACHE_FLAG = re.compile(r"^--(enable-hierarchical-cache|enable-hicache|hicache-)")

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


# --- host -------------------------------------------------------------------------------------------
def _version_tuple(text: Any) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", str(text))[:3])


def host_findings(facts: Mapping[str, Any], settings: Mapping[str, Any]) -> list[str]:
    """OS, init system, Python and GPU agents of one host.

    settings: supported_os, min_python, gpu_arch, expected_gpus, rocminfo (stdout or None when
    rocminfo is not installed).
    """
    found = []
    supported = settings.get("supported_os") or {}
    distro = str(facts.get("distribution", "?"))
    version = str(facts.get("distribution_version", "?"))
    versions = [str(v) for v in supported.get(distro, [])]
    if version not in versions and str(facts.get("distribution_major_version", "?")) not in versions:
        found.append(
            f"unsupported OS {distro} {version}: supported are {json.dumps(supported, sort_keys=True)} "
            "(preflight_supported_os); use a supported release."
        )
    init = facts.get("service_mgr", "?")
    if init != "systemd":
        found.append(
            f"init is {init}, not systemd: the SGLang server runs as a systemd unit; hicache-fleet needs "
            "a host booted with systemd as PID 1."
        )
    python, minimum = facts.get("python_version", "0"), settings.get("min_python", "3.11")
    if _version_tuple(python) < _version_tuple(minimum):
        found.append(
            f"Python {python} is older than {minimum} (preflight_min_python); install a newer python3 or set "
            "ansible_python_interpreter to one."
        )
    rocminfo = settings.get("rocminfo")
    if rocminfo is not None:
        arch = str(settings.get("gpu_arch", "gfx1100"))
        agents = len(re.findall(rf"(?m)^\s*Name:\s+{re.escape(arch)}\s*$", str(rocminfo)))
        expected = int(settings.get("expected_gpus", 0))
        if agents < expected:
            said = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(rocminfo))
            said = " ".join(re.sub(r"[^A-Za-z0-9 .,()/_:-]+", " ", said).split())[:300]
            found.append(
                f"rocminfo lists {agents} agent(s) named {arch}, expected at least {expected} "
                f"(preflight_expected_gpus / preflight_gpu_arch); rocminfo said: {said}"
            )
    return found


def gpus_found(rocminfo: Any, arch: str) -> int | None:
    """GPU agents named `arch` in rocminfo's output; None when rocminfo did not run."""
    if rocminfo is None:
        return None
    return len(re.findall(rf"(?m)^\s*Name:\s+{re.escape(str(arch))}\s*$", str(rocminfo)))


# --- RAM and disk -----------------------------------------------------------------------------------
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
        f"--hicache-size per instance) plus preflight_memory_reserve_gb = {reserve:g} GB, but {host or 'the host'} "
        f"has {ram_bytes / 1e9:.1f} GB ({memtotal_mb} MiB: MemTotal, or the RAM a simulator host was told). Lower "
        f"{' / '.join(variables) or '--hicache-size'}, lower tp-size, or run fewer instances here."
    ]


# --- kernel, Secure Boot, other GPU agents, MemAvailable ------------------------------------------------
def _os_key(facts: Mapping[str, Any]) -> str:
    distro = str(facts.get("distribution", "?"))
    version = str(facts.get("distribution_version", "?"))
    if distro != "Ubuntu":
        version = str(facts.get("distribution_major_version", version))
    return f"{distro} {version}"


def _series(kernel: Any) -> str:
    match = re.match(r"^(\d+)\.(\d+)", str(kernel))
    return f"{match.group(1)}.{match.group(2)}" if match else str(kernel)


def kernel_findings(facts: Mapping[str, Any], settings: Mapping[str, Any]) -> list[str]:
    """The running kernel (ansible_kernel) against the kernel series AMD lists for the ROCm release.

    settings: dkms (the host gets AMD's amdgpu-dkms; otherwise nothing to check), rocm_version,
    kernels ({rocm version: {"<distribution> <version>": [series, ...]}}), accept_unlisted. A series
    is "major.minor" ("6.8" matches 6.8.0-85-generic).
    """
    if not settings.get("dkms", True) or settings.get("accept_unlisted"):
        return []
    version = str(settings.get("rocm_version") or "")
    kernel = str(facts.get("kernel", "?"))
    accept = "or set preflight_kernel_accept_unlisted: true to run this kernel anyway"
    if not version:
        return [
            "the ROCm release is unknown, so the running kernel cannot be checked against AMD's list: set "
            f"rocm_version (or preflight_rocm_version) in the inventory, {accept}."
        ]
    table = (settings.get("kernels") or {}).get(version)
    if not table:
        return [
            f"preflight_rocm_supported_kernels has no kernel list for ROCm {version} (rocm_version); add it from "
            f"AMD's system requirements for that release, {accept}."
        ]
    key = _os_key(facts)
    series = [str(item) for item in table.get(key, [])]
    if _series(kernel) in series:
        return []
    listed = ", ".join(series) if series else f"none for {key}"
    return [
        f"running kernel {kernel} ({key}) is not one AMD lists for ROCm {version} (series {listed}; "
        "preflight_rocm_supported_kernels): amdgpu-dkms may not build or load, leaving no /dev/kfd. Boot a listed "
        f"kernel, change rocm_version to a release that lists it, {accept}."
    ]


def secure_boot_state(probe: Any) -> str:
    """enabled, disabled or absent (no EFI) from the probe's output.

    The probe prints the SecureBoot EFI variable's value byte (1 enabled, 0 disabled), or the output
    of `mokutil --sb-state`, or `no-efi`.
    """
    text = str(probe or "").strip()
    lowered = text.lower()
    if text == "1" or "secureboot enabled" in lowered:
        return "enabled"
    if text == "0" or "secureboot disabled" in lowered:
        return "disabled"
    return "absent"


def secure_boot_findings(probe: Any, settings: Mapping[str, Any]) -> list[str]:
    """Enabled Secure Boot with AMD's DKMS amdgpu: the unsigned module does not load after the reboot.

    settings: dkms (the host gets amdgpu-dkms), mok_enrolled (the inventory says the DKMS signing key
    is enrolled as a MOK).
    """
    if not settings.get("dkms") or settings.get("mok_enrolled"):
        return []
    if secure_boot_state(probe) != "enabled":
        return []
    return [
        "Secure Boot is enabled and the amdgpu driver comes from AMD's DKMS package: a module signed with a key the "
        "firmware does not trust is refused at boot, so after the reboot there is no /dev/kfd and no GPU. Enroll the "
        "DKMS signing key (mokutil --import /var/lib/dkms/mok.pub, confirm at the next boot) and set "
        "preflight_secure_boot_mok_enrolled: true, or disable Secure Boot in the firmware."
    ]


def gpu_agents(rocminfo: Any) -> list[dict[str, str]]:
    """GPU agents of rocminfo's output, in its order (HIP's device order): {name, marketing_name}."""
    agents = []
    for block in re.split(r"(?m)^\*+\s*\n\s*Agent\s+\d+\s*\n\*+\s*$", str(rocminfo or ""))[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            match = re.match(r"^  (\S[^:]*):\s*(.*?)\s*$", line)  # agent-level keys only (2 spaces)
            if match and match.group(1) not in fields:
                fields[match.group(1)] = match.group(2)
        if fields.get("Device Type") == "GPU":
            agents.append({"name": fields.get("Name", "?"), "marketing_name": fields.get("Marketing Name", "")})
    return agents


def other_gpu_findings(rocminfo: Any, settings: Mapping[str, Any]) -> list[str]:
    """A GPU agent that is not the expected gfx target (e.g. a Ryzen 7000's iGPU, gfx1036).

    settings: gpu_arch, accept_other (the inventory accepts such agents). HIP enumerates the iGPU as a
    device too, shifting HIP_VISIBLE_DEVICES and offering a tiny device to the runtime.
    """
    if rocminfo is None or settings.get("accept_other"):
        return []
    arch = str(settings.get("gpu_arch", "gfx1100"))
    agents = gpu_agents(rocminfo)
    others = [(index, agent) for index, agent in enumerate(agents) if agent["name"] != arch]
    if not others:
        return []
    listed = ", ".join(
        f"HIP device {index}: {agent['name']}" + (f" ({agent['marketing_name']})" if agent["marketing_name"] else "")
        for index, agent in others
    )
    return [
        f"rocminfo lists GPU agent(s) that are not {arch} (preflight_gpu_arch): {listed}. An integrated GPU is "
        "enumerated by HIP beside the cards and shifts the device indices; AMD advises disabling the iGPU in the "
        "BIOS. Disable it there, or set preflight_gpu_accept_other_agents: true and map each instance's "
        "HIP_VISIBLE_DEVICES to the cards."
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
        f"(preflight_sglang_host_reserve_gib): {available / 1e9:.1f} GB available{running} - "
        f"{reserve / 1e9:.1f} GB = {(usable - reserve) / 1e9:.1f} GB. Lower "
        f"{' / '.join(variables) or '--hicache-size'}, lower tp-size, or free memory on the host."
    ]


# --- SGLang argv against its flag table -------------------------------------------------------------
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
        return None  # a bound that is no number is refused with preflight_sglang_ranges itself
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
    # `ranges` (preflight_sglang_ranges) adds to the built-in table, never replaces it: both apply.
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


# --- the sglang_service plan ------------------------------------------------------------------------
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


def service_findings(
    plan: Sequence[Mapping[str, Any]],
    instances: Sequence[Mapping[str, Any]],
    table: Mapping[str, Any],
    settings: Mapping[str, Any],
) -> list[str]:
    """Every check of the rendered sglang_service plan that needs no host access.

    settings: profiles (names), ranges, draft_free_algorithms, draft_from_models (true: the models
    role will provide the draft path later, so an empty one is not an error yet), environment (the
    fleet's, merged before each instance's), gpus (GPU agents found, or None), probe
    ({rollout_probe_input_len, rollout_probe_input_len_canary, output_len}).
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
    probe = settings.get("probe") or {}
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
        context = _whole(args.get("--context-length"))
        if context and probe:
            output = _whole(probe.get("output_len")) or 0
            for variable in ("rollout_probe_input_len_canary", "rollout_probe_input_len"):
                length = _whole(probe.get(variable))
                if length is not None and length + output > context:
                    found.append(
                        f"{unit}: {variable} = {length} (+ rollout_probe_cold_output_len {output}) is longer than "
                        f"its --context-length {context}; lower {variable} or raise --context-length."
                    )
    found.extend(probe_pool_findings(plan, probe))
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
    """Free disk the L3 tiers need (preflight tasks/disk.yml's needs): each instance's size limit less
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


# The probe module's default filler_factor (module_utils/sglang_probe_measure.py ARGUMENT_SPEC), which the
# rollout role does not change: the host-tier proof pushes ceil(1.0 x the device pool) filler tokens.
PROBE_FILLER_FACTOR = 1.0


def probe_host_pool_tokens(
    args: Mapping[str, Any], kv_bytes_per_token: int, device_tokens: int, mamba_device_bytes: int = 0
) -> int | None:
    """Host KV pool tokens per rank as SGLang 0.5.23 sizes it (src/mem_cache/pool_host/base.py
    HostKVCache.__init__; the same arithmetic as module_utils/sglang_pool_plan.py host_tokens and
    expected_host_range, which a test compares): --hicache-size GB x 1e9 // bytes per token, else
    int(device tokens x --hicache-ratio), plus one padding page. A hybrid model's --hicache-size is split
    with the Mamba host pool in proportion of the DEVICE pools' bytes (hybrid_cache/hybrid_pool_assembler.py
    _split_hicache_size): the KV pool's (device tokens + 1 page) x bytes per token against
    mamba_device_bytes (preflight_mamba_device_bytes; module_utils/sglang_pool_plan.py mamba_device_bytes
    works it out from config.json and the launch)."""
    page = _whole(args.get("--page-size")) or 1
    size = _whole(args.get("--hicache-size")) or 0
    if size > 0:
        gb = float(size)
        if mamba_device_bytes and mamba_device_bytes > 0:
            kv_bytes = (device_tokens + page) * kv_bytes_per_token
            gb = gb * kv_bytes / (kv_bytes + mamba_device_bytes)
        tokens = int(gb * 1e9 // kv_bytes_per_token)
    else:
        try:
            ratio = float(args.get("--hicache-ratio"))
        except (TypeError, ValueError):
            ratio = 1.2 if str(args.get("--hicache-host-memory-mode")) == "buffer_only" else 2.0
        tokens = int(device_tokens * ratio)
    return (tokens // page + 1) * page


def probe_pool_findings(plan: Sequence[Mapping[str, Any]], probe: Mapping[str, Any]) -> list[str]:
    """Issue 25 item 3: the host pool must hold the probed prefix plus the fillers the host-tier proof pushes
    through it. probe: rollout_probe_input_len(_canary), device_tokens (preflight_probe_device_tokens),
    kv_bytes_per_token (preflight_kv_bytes_per_token), mamba_device_bytes (preflight_mamba_device_bytes, 0
    for a dense model); device_tokens or kv_bytes_per_token 0: not checked."""
    device = _whole(probe.get("device_tokens")) or 0
    bpt = _whole(probe.get("kv_bytes_per_token")) or 0
    mamba = _whole(probe.get("mamba_device_bytes")) or 0
    if device <= 0 or bpt <= 0:
        return []
    filler = math.ceil(device * PROBE_FILLER_FACTOR)
    found = []
    for entry in plan:
        args = entry.get("args") or {}
        if not entry.get("hicache") or not args.get("--enable-hierarchical-cache"):
            continue
        split = ""
        if mamba > 0 and (_whole(args.get("--hicache-size")) or 0) > 0:
            split = f", its KV share against preflight_mamba_device_bytes {mamba}"
        host = probe_host_pool_tokens(args, bpt, device, mamba)
        for variable in ("rollout_probe_input_len_canary", "rollout_probe_input_len"):
            length = _whole(probe.get(variable))
            if length is None or length + filler <= host:
                continue
            found.append(
                f"{entry.get('unit')}: its HiCache host pool holds {host} tokens per rank (--hicache-size "
                f"{args.get('--hicache-size', 0)} GB / --hicache-ratio {args.get('--hicache-ratio', 'default')} at "
                f"preflight_kv_bytes_per_token {bpt}{split}) but the probe's host tier needs {length + filler}: "
                f"{variable} {length} + {filler} filler tokens (one device pool, preflight_probe_device_tokens "
                f"{device}). Raise '--hicache-size' in sglang_service_hicache_args or lower {variable}."
            )
    return found


# --- rollout settings ---------------------------------------------------------------------------------
def rollout_findings(settings: Mapping[str, Any]) -> list[str]:
    """rollout_batches, the probe's numbers, the pause and continuation, and the venv package set.

    settings: batches, probe {name: value} (positive numbers expected), pause_after, continue, package_set,
    package_sets.
    """
    found: list[str] = []
    batches = settings.get("batches")
    if not isinstance(batches, Sequence) or isinstance(batches, (str, bytes)) or not batches:
        found.append(
            f"rollout_batches = {batches!r} is not a non-empty list; use e.g. [1, '25%', '100%'] (host counts or "
            "percentages)."
        )
    else:
        for batch in batches:
            count = _whole(batch)
            percent = _PERCENT.fullmatch(str(batch)) if count is None else None
            if (count is not None and count >= 1) or (percent and 1 <= int(percent.group(1)) <= 100):
                continue
            found.append(
                f"rollout_batches: {batch!r} is not a batch size; each entry is a host count >= 1 or a percentage "
                "'1%'-'100%'."
            )
    for name, value in (settings.get("probe") or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = None
        if number is None or number <= 0 or isinstance(value, bool):
            found.append(f"{name} = {value!r} is not a positive number; set it to one (see roles/rollout/defaults).")
    pause = settings.get("pause_after", "")
    pause_n = _whole(pause)
    if pause not in ("", None, "canary") and (pause_n is None or pause_n < 1 or isinstance(pause, bool)):
        found.append(
            f"rollout_pause_after = {pause!r} is not a batch; use '' (no pause), 'canary' (after the first batch) or a "
            "batch number >= 1."
        )
    cont = settings.get("continue", "")
    if cont not in ("", None) and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", str(cont)):
        found.append(
            f"rollout_continue = {cont!r} is not a run id; give the id the paused run's report names (its directory "
            "name under rollout_report_dir)."
        )
    package_set, package_sets = settings.get("package_set"), settings.get("package_sets")
    if package_sets is not None and package_set not in package_sets:
        found.append(
            f"sglang_venv_package_set = {package_set!r} is not in sglang_venv_package_sets (known: "
            f"{', '.join(sorted(package_sets))}); pick one of them."
        )
    return found


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


def argument_spec_findings(checks: Mapping[str, Any], roles: Sequence[str]) -> list[str]:
    """Errors of each role in `roles`, in that order, from what its entry point argument_check published
    (<role>_argument_check: the result of ansible.builtin.validate_argument_spec over all of the role's
    entry points' options). A role that published nothing or a skipped check, or a check that stopped
    before it could validate (a value that does not render), is a finding too: its variables were not
    checked."""
    found = []
    for role in roles:
        result = checks.get(role)
        where = f"roles/{role}/meta/argument_specs.yml"
        if not isinstance(result, Mapping) or result.get("skipped"):
            found.append(f"the {role} role's variables were not checked against {where}: its entry point "
                         f"argument_check published no {role}_argument_check; restore "
                         f"roles/{role}/tasks/argument_check.yml (a fault of the toolkit, not of the inventory).")
            continue
        errors = result.get("argument_errors") or []
        for error in errors:
            found.append(f"{error} ({where}); fix that variable in the inventory or -e.")
        if result.get("failed") and not errors:
            found.append(f"the {role} role's variables could not be checked against {where}: "
                         f"{result.get('msg', 'no message')}; fix the value it names in the inventory or -e.")
    return found


def summary(findings: Sequence[Any], host: str, note: str = "") -> str:
    """One message for every finding on a host."""
    items = [" ".join(str(item).split()) for item in findings if item]
    lines = [f"preflight found {len(items)} problem(s) on {host}{'; ' + note if note else ''}:"]
    lines += [f"  {number}. {item}" for number, item in enumerate(items, start=1)]
    return "\n".join(lines)


def rocminfo(result: Mapping[str, Any], stderr: bool = False) -> str | None:
    """The rocminfo run's stdout (and, with `stderr`, a space and its stderr); None when it was skipped."""
    if result.get("skipped"):
        return None
    out = str(result.get("stdout", ""))
    return f"{out} {result.get('stderr', '')}" if stderr else out


def gpus_counted(rocminfo_output: Any, arch: str, expected: int) -> int | None:
    """preflight_gpus_found of the output, or None when rocminfo did not run or no GPU is expected (0)."""
    if rocminfo_output is None or not expected > 0:
        return None
    return gpus_found(rocminfo_output, arch)


def bytes_needed(gb: int, needed: bool) -> int:
    """`gb` × 1e9 when the stage is needed, else 0."""
    return gb * 1000000000 if needed else 0


class FilterModule:
    """Jinja filters of the preflight role."""

    def filters(self) -> dict[str, Any]:
        return {
            "preflight_host_findings": host_findings,
            "preflight_gpus_found": gpus_found,
            "preflight_ram_findings": ram_findings,
            "preflight_kernel_findings": kernel_findings,
            "preflight_secure_boot_findings": secure_boot_findings,
            "preflight_gpu_agents": gpu_agents,
            "preflight_other_gpu_findings": other_gpu_findings,
            "preflight_mem_available_findings": mem_available_findings,
            "preflight_sglang_argv": sglang_argv,
            "preflight_service_findings": service_findings,
            "preflight_rollout_findings": rollout_findings,
            "preflight_port_findings": port_findings,
            "preflight_argument_spec_findings": argument_spec_findings,
            "preflight_summary": summary,
            "preflight_rocminfo": rocminfo,
            "preflight_gpus_counted": gpus_counted,
            "preflight_bytes_needed": bytes_needed,
            "preflight_l3_findings": l3_findings,
            "preflight_l3_disk_needs": l3_disk_needs,
        }
