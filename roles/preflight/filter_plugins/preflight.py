"""Filters of the preflight role: every check as a plain function that returns its findings.

A finding is one string that says what is wrong, names the variable and says how to fix it. The
role collects them per host and fails once with the list (``preflight_summary``). The checks of the
SGLang service config are the sglang_service role's own (its entry point check, which preflight
calls); the free-disk check is the module library/fleet_free_disk.py, which the models and
sglang_service roles call too.

- ``preflight_host_findings(facts, settings)``: OS, init, Python, GPU agents (rocminfo).
- ``preflight_probe_findings(plan, probe)``: the rollout's probe against the service plan: the
  probe prompt within --context-length, and the host pool holding the probed prefix plus its filler.
- ``preflight_rollout_findings(settings)``: batches, probe settings, package set.
- ``preflight_renamed_findings(names)``: a renamed variable (now the sglang_service role's) still set.
- ``preflight_kernel_findings(facts, settings)``: the running kernel against the ROCm release's list.
- ``preflight_secure_boot_findings(probe, settings)``: Secure Boot with AMD's DKMS amdgpu module.
- ``preflight_gpu_agents(rocminfo)`` / ``preflight_other_gpu_findings(rocminfo, settings)``: rocminfo's
  GPU agents; a GPU agent that is not the expected gfx target (an enabled iGPU).
- ``preflight_argument_spec_findings(checks, roles)``: each role's argument_check errors.
- ``preflight_summary(findings, host)``: the one message per host.
- ``preflight_rocminfo(result, stderr=false)``: what the rocminfo run printed, none when it did not run.
- ``preflight_gpus_counted(rocminfo, arch, expected)``: the GPU agents found, none when rocminfo did
  not run or no GPU is expected.
- ``preflight_bytes_needed(gb, needed)``: GB as bytes (1e9) when the stage is needed, else 0.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain-Python use (unit tests without Ansible)
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]

_PERCENT = re.compile(r"([0-9]+)%")


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


# --- SGLang argv against its flag table -------------------------------------------------------------


# --- the rollout's probe against the sglang_service plan -------------------------------------------


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


def probe_findings(plan: Sequence[Mapping[str, Any]], probe: Mapping[str, Any]) -> list[str]:
    """The rollout's probe against the service plan (sglang_service_plan): each probe prompt plus its
    output within the instance's --context-length, and the probe-pool rule (probe_pool_findings).

    probe: rollout_probe_input_len(_canary), output_len (rollout_probe_cold_output_len), device_tokens,
    kv_bytes_per_token, mamba_device_bytes.
    """
    found: list[str] = []
    output = _whole(probe.get("output_len")) or 0
    for entry in plan:
        context = _whole((entry.get("args") or {}).get("--context-length"))
        if not context or not entry.get("profile_known", True):
            continue
        for variable in ("rollout_probe_input_len_canary", "rollout_probe_input_len"):
            length = _whole(probe.get(variable))
            if length is not None and length + output > context:
                found.append(
                    f"{entry.get('unit')}: {variable} = {length} (+ rollout_probe_cold_output_len {output}) is longer "
                    f"than its --context-length {context}; lower {variable} or raise --context-length."
                )
    return found + probe_pool_findings(plan, probe)


# Variables of an older release that the sglang_service role now owns (it runs the checks they set).
RENAMED = {
    "preflight_memory_reserve_gb": "sglang_service_memory_reserve_gb",
    "preflight_sglang_host_reserve_gib": "sglang_service_sglang_reserve_gib",
    "preflight_check_mem_available": "sglang_service_check_mem_available",
    "preflight_sglang_ranges": "sglang_service_flag_ranges",
}


def renamed_findings(names: Sequence[Any]) -> list[str]:
    """A finding for each variable set (names: the varnames lookup's) that was renamed: its value would
    otherwise be ignored without a word (a reserve of 32 GB silently back to the default 16)."""
    return [
        f"{name} is set but no longer read: the sglang_service role owns this setting now as {RENAMED[name]}. "
        f"Rename it to {RENAMED[name]} in the inventory."
        for name in sorted({str(n) for n in names} & set(RENAMED))
    ]


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
            "preflight_kernel_findings": kernel_findings,
            "preflight_secure_boot_findings": secure_boot_findings,
            "preflight_gpu_agents": gpu_agents,
            "preflight_other_gpu_findings": other_gpu_findings,
            "preflight_rollout_findings": rollout_findings,
            "preflight_probe_findings": probe_findings,
            "preflight_renamed_findings": renamed_findings,
            "preflight_argument_spec_findings": argument_spec_findings,
            "preflight_summary": summary,
            "preflight_rocminfo": rocminfo,
            "preflight_gpus_counted": gpus_counted,
            "preflight_bytes_needed": bytes_needed,
        }
