"""Filters of the first_host role: each layer's raw output → a verdict with its evidence, and the report.

Every layer of the smoke runs one read-only command (or starts the transient server) with
`failed_when: false`; these functions decide passed / failed from what it printed, keep the evidence
(the command as the operator would type it, its exit status, its output trimmed) and build the
report. Plain functions on plain data, tested in tests/first_host without Ansible.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from typing import Any

LAYERS: list[tuple[str, str]] = [
    ("driver", "the GPU driver is loaded, its device node exists"),
    ("rocminfo", "rocminfo lists the GPU agents"),
    ("torch", "the venv's torch sees the cards"),
    ("kernel", "the kernel package imports and one of its ops runs"),
    ("server", "the server starts and answers its health check"),
    ("probe", "one cold/warm probe"),
]
NAMES = [name for name, _ in LAYERS]
TITLES = dict(LAYERS)


# --- evidence ----------------------------------------------------------------------------------------

def first_host_trim(text: Any, max_lines: int = 40, max_chars: int = 6000) -> str:
    """Text cut to at most max_lines lines (the first and the last ones, a note in between) and max_chars."""
    text = "" if text is None else str(text)
    lines = text.rstrip("\n").splitlines()
    max_lines = max(int(max_lines), 2)
    if len(lines) > max_lines:
        head = max_lines // 2
        tail = max_lines - head
        lines = [*lines[:head], f"… ({len(lines) - max_lines} lines left out) …", *lines[-tail:]]
    out = "\n".join(lines)
    if len(out) > max_chars:
        half = max_chars // 2
        out = out[:half] + f"\n… ({len(out) - max_chars} characters left out) …\n" + out[-half:]
    return out


def _command_line(argv: Any) -> str:
    if isinstance(argv, (list, tuple)):
        return shlex.join(str(a) for a in argv)
    return str(argv or "")


def _output(result: dict[str, Any]) -> str:
    """stdout and stderr of a command result, or the module's message when the command never ran."""
    parts = [str(result.get("stdout") or "").rstrip("\n"), str(result.get("stderr") or "").rstrip("\n")]
    text = "\n".join(p for p in parts if p)
    if not text and result.get("msg"):
        text = str(result["msg"])
    return text


def _evidence(command: Any, result: dict[str, Any] | None, max_lines: int, output: str | None = None) -> dict[str, Any]:
    result = result or {}
    return {
        "command": _command_line(command),
        "rc": result.get("rc"),
        "output": first_host_trim(_output(result) if output is None else output, max_lines),
    }


def _layer(name: str, passed: bool, summary: str, evidence: list[dict[str, Any]], fix: str = "",
           details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "title": TITLES[name],
        "status": "passed" if passed else "failed",
        "summary": summary,
        "fix": "" if passed else fix,
        "evidence": evidence,
        "details": details or {},
    }


def _never_ran(result: dict[str, Any]) -> str | None:
    """The reason a command did not run at all (missing executable, module error), else None."""
    if result.get("rc") is None and result.get("msg"):
        return str(result["msg"])
    silent = not result.get("stdout") and not result.get("stderr")
    if result.get("rc") not in (None, 0) and silent and result.get("msg"):
        return str(result["msg"])
    return None


def _json_line(stdout: Any) -> dict[str, Any] | None:
    """The last line of stdout that is a JSON object (the check scripts print one)."""
    for line in reversed(str(stdout or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


# --- 1. driver ---------------------------------------------------------------------------------------

def first_host_driver_layer(result: dict[str, Any], module: str, device: str, command: list[str],
                            max_lines: int = 40) -> dict[str, Any]:
    """`stat -c '%F|%n' /sys/module/<module> <device>` → passed when the first is a directory and the
    second a character device."""
    found: dict[str, str] = {}
    for line in str(result.get("stdout") or "").splitlines():
        kind, _, path = line.partition("|")
        if path:
            found[path] = kind
    module_path = f"/sys/module/{module}"
    problems = []
    if found.get(module_path) != "directory":
        problems.append(f"the {module} module is not loaded ({module_path} is missing)")
    kind = found.get(device)
    if kind is None:
        problems.append(f"{device} does not exist")
    elif kind != "character special file":
        problems.append(f"{device} is a {kind}, not a character device")
    evidence = [_evidence(command, result, max_lines)]
    if not problems:
        return _layer("driver", True, f"{module_path} is present and {device} is a character device", evidence)
    fix = (f"load the driver (modprobe {module}; dmesg | grep -i {module}), check Secure Boot with an unsigned "
           f"DKMS module and that the rocm role's reboot happened (first_host_driver_module, first_host_driver_device)")
    return _layer("driver", False, "; ".join(problems), evidence, fix)


# --- 2. rocminfo -------------------------------------------------------------------------------------

_AGENT = re.compile(r"^\s*Agent\s+(\d+)\s*$")
_FIELD = re.compile(r"^\s{2}(Name|Marketing Name|Device Type|Uuid|Node|Chip ID|BDFID|Compute Unit):\s*(.*?)\s*$")


def first_host_rocminfo_agents(stdout: str) -> list[dict[str, Any]]:
    """rocminfo output → its agents in order ({agent, name, marketing_name, device_type, uuid, node, ...});
    GPU agents also get `hip_index`: 0, 1, ... in rocminfo's order ("Agent N" counts CPUs too)."""
    agents: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in str(stdout or "").splitlines():
        match = _AGENT.match(line)
        if match:
            current = {"agent": int(match.group(1))}
            agents.append(current)
            continue
        field = _FIELD.match(line)
        if field and current is not None:
            key = field.group(1).lower().replace(" ", "_")
            current.setdefault(key, field.group(2))
    hip = 0
    for agent in agents:
        if agent.get("device_type") == "GPU":
            agent["hip_index"] = hip
            hip += 1
    return agents


def first_host_rocminfo_layer(result: dict[str, Any], expected_count: int, arch: str, command: list[str],
                              allow_other_gpus: bool = False, max_lines: int = 40) -> dict[str, Any]:
    """Passed when rocminfo ran and lists exactly `expected_count` GPU agents named `arch` (and, unless
    allowed, no GPU agent of another kind, such as an enabled iGPU that HIP would count as device 0)."""
    evidence_lines = max_lines
    never = _never_ran(result)
    if never:
        return _layer("rocminfo", False, f"rocminfo did not run: {never}", [_evidence(command, result, evidence_lines)],
                      "install the ROCm runtime tools (the rocm role) or set first_host_rocminfo_command")
    agents = first_host_rocminfo_agents(result.get("stdout", ""))
    gpus = [a for a in agents if a.get("device_type") == "GPU"]
    matching = [a for a in gpus if a.get("name") == arch]
    other = [a for a in gpus if a.get("name") != arch]
    listed = ", ".join(f"HIP {a['hip_index']}: {a.get('name')} ({a.get('marketing_name', '?')})"
                       for a in gpus) or "none"
    summary_list = "GPU agents: " + listed
    output = _output(result)
    if gpus:
        # Keep the lines the verdict was read from, not the whole (long) listing.
        keep = [line for line in output.splitlines()
                if _AGENT.match(line) or _FIELD.match(line) or "ROCk" in line]
        output = "\n".join(keep)
    evidence = [_evidence(command, result, evidence_lines, output)]
    details = {"gpu_agents": gpus, "cpu_agents": len(agents) - len(gpus)}
    if result.get("rc") == 124:
        return _layer("rocminfo", False, "rocminfo timed out (first_host_rocminfo_timeout_s)", evidence,
                      "rocminfo hangs when the runtime cannot open /dev/kfd: check dmesg and the driver", details)
    if result.get("rc") == 127:
        return _layer("rocminfo", False, f"{first_host_trim(_output(result), 3)}", evidence,
                      "install the ROCm runtime tools (the rocm role) or set first_host_rocminfo_command", details)
    if result.get("rc") not in (0, None):
        return _layer("rocminfo", False, f"rocminfo exited {result.get('rc')}; {summary_list}", evidence,
                      "read rocminfo's message: the user needs the render and video groups, the driver must be loaded",
                      details)
    problems = []
    if len(matching) != int(expected_count):
        problems.append(f"{len(matching)} GPU agent(s) of {arch}, expected {expected_count}")
    if other and not allow_other_gpus:
        problems.append(f"{len(other)} GPU agent(s) of another kind ("
                        + ", ".join(f"{a.get('name')} {a.get('marketing_name', '')}".strip() for a in other)
                        + ") come before or between the cards in HIP's numbering")
    if not problems:
        return _layer("rocminfo", True, f"{len(matching)} x {arch}; {summary_list}", evidence, details=details)
    fix = ("check every card is seated and bound by amdgpu (dmesg, lspci -k), disable an iGPU in the BIOS "
           "(or first_host_allow_other_gpu_agents: true), or correct first_host_gpu_count / first_host_gpu_arch")
    return _layer("rocminfo", False, "; ".join(problems) + f"; {summary_list}", evidence, fix, details)


# --- 3. torch and 4. kernel (roles/first_host/files/first_host_gpu.py prints one JSON line) -----------

def _script_failure(name: str, result: dict[str, Any], data: dict[str, Any] | None, command: list[str],
                    max_lines: int, fix: str) -> dict[str, Any] | None:
    never = _never_ran(result)
    if never and data is None:
        return _layer(name, False, f"the check did not run: {never}", [_evidence(command, result, max_lines)], fix)
    if data is None:
        stderr = str(result.get("stderr") or "")
        if "Timeout (" in stderr:
            why = "it timed out (every thread's traceback below)"
        elif result.get("rc") == 127:
            why = f"{command[0]} was not found"
        else:
            why = f"it exited {result.get('rc')} without a result"
        return _layer(name, False, f"the check crashed: {why}", [_evidence(command, result, max_lines)], fix)
    if data.get("error"):
        return _layer(name, False, f"{data.get('stage', 'check')} failed: {data['error']}",
                      [_evidence(command, result, max_lines)], fix, data)
    return None


def first_host_torch_layer(result: dict[str, Any], expected_count: int, device_type: str, arch: str,
                           command: list[str], max_lines: int = 40) -> dict[str, Any]:
    """Passed when torch imports and sees `expected_count` devices of `device_type`, each of `arch`
    (gcnArchName without its feature suffix; not checked when arch is empty)."""
    data = _json_line(result.get("stdout"))
    fix = ("check first_host_python (the sglang_venv role's current), that torch is a ROCm build "
           "(torch.version.hip) and that the user may open /dev/kfd and /dev/dri (render, video groups)")
    failure = _script_failure("torch", result, data, command, max_lines, fix)
    if failure:
        return failure
    assert data is not None
    devices = data.get("devices") or []
    count = int(data.get("count") or 0)
    build = f"torch {data.get('torch')}" + (f" (HIP {data['hip']})" if data.get("hip") else " (no HIP)")
    seen = ", ".join(f"{d.get('index')}: {d.get('name')} {d.get('arch') or ''}".strip() for d in devices) or "none"
    problems = []
    if count != int(expected_count):
        problems.append(f"torch.{device_type}.device_count() = {count}, expected {expected_count}")
    if arch:
        wrong = [d for d in devices if d.get("arch") != arch]
        if wrong:
            problems.append(f"{len(wrong)} device(s) not {arch}: "
                            + ", ".join(f"{d.get('index')}: {d.get('arch')}" for d in wrong))
    evidence = [_evidence(command, result, max_lines)]
    if not problems:
        checked = f", each {arch}" if arch else " (arch not checked: first_host_torch_arch is empty)"
        return _layer("torch", True, f"{build} sees {count} {device_type} device(s){checked}: {seen}", evidence,
                      details=data)
    return _layer("torch", False, f"{build}: " + "; ".join(problems) + f"; devices: {seen}", evidence, fix, data)


def first_host_kernel_layer(result: dict[str, Any], module: str, op: str, command: list[str],
                            max_lines: int = 40) -> dict[str, Any]:
    """Passed when the kernel module imports and its op ran on the device and matched torch's reference."""
    data = _json_line(result.get("stdout"))
    fix = (f"{module} must be built for this torch and ROCm (playbooks: the release check names missing "
           f"symbols); set first_host_kernel_module / first_host_kernel_op, or skip the layer "
           f"(first_host_skip_layers: [kernel]) on a host that has no kernel")
    failure = _script_failure("kernel", result, data, command, max_lines, fix)
    if failure:
        return failure
    assert data is not None
    evidence = [_evidence(command, result, max_lines)]
    where = f"{module} {data.get('version') or ''}".strip()
    ran = f"{op} on {data.get('device')} {data.get('shape')}"
    if data.get("ok"):
        return _layer("kernel", True,
                      f"{where} imported, {ran} matches torch (max abs error {data.get('max_abs_err')})",
                      evidence, details=data)
    return _layer("kernel", False, f"{where}: {ran} differs from torch's reference (max abs error "
                  f"{data.get('max_abs_err')} > {data.get('tolerance')})", evidence, fix, data)


# --- 5. server ---------------------------------------------------------------------------------------

def first_host_server_layer(port_check: dict[str, Any], start: dict[str, Any], wait: dict[str, Any],
                            journal: dict[str, Any], start_command: list[str], url: str, unit: str,
                            journal_command: list[str], max_lines: int = 40) -> dict[str, Any]:
    """Passed when the port was free, systemd-run started the unit and the health URL answered 200
    while the unit was active. The server's log lines are evidence either way."""
    evidence = []
    address = url.split("/")[2]
    port = _json_line(port_check.get("stdout")) or {}
    if not port.get("free"):
        evidence.append({"command": f"connect {address}", "rc": port_check.get("rc"),
                         "output": first_host_trim(port.get("detail") or _output(port_check), max_lines)})
        return _layer("server", False, f"{address} is not free ({port.get('detail') or 'the check did not run'}): "
                      "the smoke would probe another server", evidence,
                      "pick a free loopback port (first_host_server_port)")
    evidence.append(_evidence(start_command, start, max_lines))
    if start.get("rc") != 0:
        return _layer("server", False, f"systemd-run could not start {unit}", evidence,
                      f"read systemd-run's message (a leftover unit: systemctl stop {unit}; "
                      f"systemctl reset-failed {unit})")
    data = _json_line(wait.get("stdout")) or {}
    every = f"every {data.get('interval_s', '?')} s, at most {data.get('timeout_s', '?')} s"
    evidence.append({"command": f"GET {url} ({every})",
                     "rc": wait.get("rc"),
                     "output": first_host_trim(json.dumps({k: v for k, v in data.items() if k != 'unit'},
                                                          sort_keys=True) if data else _output(wait), max_lines)})
    evidence.append(_evidence(journal_command, journal, max_lines))
    details = {"unit": data.get("unit", {}), "waited_s": data.get("waited_s")}
    if data.get("healthy"):
        return _layer("server", True, f"{unit} answered {url} with 200 after {data.get('waited_s')} s", evidence,
                      details=details)
    if data.get("ended"):
        why = f"{unit} ended before it was healthy ({data.get('state', 'gone')})"
    elif data:
        last = data.get("last_error") or data.get("last_status")
        why = f"{url} did not answer 200 within {data.get('timeout_s')} s (last: {last})"
    else:
        why = "the health wait crashed"
    return _layer("server", False, why + ": its log lines are below", evidence,
                  "read the server's log lines (model path, memory, flags: first_host_model_path, "
                  "first_host_server_args)",
                  details)


# --- 6. probe ----------------------------------------------------------------------------------------

def first_host_probe_layer(result: dict[str, Any], url: str, input_len: int, tier: str,
                           max_lines: int = 40) -> dict[str, Any]:
    """The sglang_cache_probe module's result → passed when its gate passed."""
    command = f"sglang_cache_probe url={url} input_len={input_len} tier={tier} repeats=1"
    gate = result.get("gate") or {}
    lines = [str(result.get("msg", ""))]
    for reason in gate.get("reasons") or []:
        lines.append(f"- {reason}")
    server = result.get("server") or {}
    if server:
        lines.append(f"server: version {server.get('version')}, model {server.get('model_path')}, "
                     f"max_total_num_tokens {server.get('max_total_num_tokens')}")
    evidence = [{"command": command, "rc": None, "output": first_host_trim("\n".join(lines), max_lines)}]
    cold = (result.get("cold") or {}).get("median_ttft_ms")
    warm = {t: w.get("median_ttft_ms") for t, w in (result.get("warm") or {}).items()}
    details = {"cold_ttft_ms": cold, "warm_ttft_ms": warm, "requests_sent": result.get("requests_sent")}
    if not result.get("failed") and gate.get("passed", False):
        warm_text = ", ".join(f"{t} {v} ms" for t, v in warm.items())
        return _layer("probe", True, f"cold TTFT {cold} ms, warm {warm_text}; the warm read came from the cache",
                      evidence, details=details)
    why = "; ".join(gate.get("reasons") or []) or str(result.get("msg", "the probe failed"))
    return _layer("probe", False, why, evidence,
                  "the server runs but does not serve a cached prefix: read the probe's reasons and the server's log",
                  details)


# --- skipped and check mode --------------------------------------------------------------------------

def first_host_skipped_layer(name: str, why: str, would_run: list[str] | None = None) -> dict[str, Any]:
    """A layer that did not run on purpose: switched off (first_host_skip_layers) or check mode."""
    status = "check mode" if why == "check mode" else "skipped"
    summary = (f"not run in check mode; it would run: {'; '.join(would_run or [])}" if status == "check mode"
               else f"skipped ({why})")
    return {"name": name, "title": TITLES[name], "status": status, "summary": summary, "fix": "",
            "evidence": [{"command": c, "rc": None, "output": ""} for c in (would_run or [])], "details": {}}


def first_host_skipped_layers(skip: list[str]) -> list[dict[str, Any]]:
    """The layers first_host_skip_layers switches off (probe too when server is off), as report entries."""
    skip = list(skip or [])
    entries = [first_host_skipped_layer(name, "first_host_skip_layers") for name in NAMES if name in skip]
    if "server" in skip and "probe" not in skip:
        entries.append(first_host_skipped_layer("probe", "needs the server layer, which first_host_skip_layers skips"))
    return entries


def first_host_systemd_run(unit: str, python: str, module: str, model_path: str, host: str, port: int,
                           args: list[Any], properties: list[str], environment: dict[str, Any],
                           max_runtime_s: int, stop_timeout_s: int) -> list[str]:
    """The argv that starts the transient server: systemd-run with its properties and environment,
    then `python -m module --model-path ... --host ... --port ...` and the launch flags."""
    argv = ["systemd-run", f"--unit={unit}", "--collect", "--quiet",
            "--description=hicache-fleet first-host smoke server (transient)",
            "--property=Type=exec", f"--property=RuntimeMaxSec={int(max_runtime_s)}",
            f"--property=TimeoutStopSec={int(stop_timeout_s)}"]
    argv += [f"--property={p}" for p in properties or []]
    argv += [f"--setenv={k}={v}" for k, v in sorted((environment or {}).items())]
    argv += ["--", python, "-m", module, "--model-path", model_path, "--host", host, "--port", str(port)]
    argv += [str(a) for a in args or []]
    return argv


def first_host_go(layers: list[dict[str, Any]]) -> bool:
    """True while no layer has failed: the next layer runs."""
    return not any(layer.get("status") == "failed" for layer in layers or [])


# --- cleanup and the report --------------------------------------------------------------------------

def first_host_cleanup(stop: dict[str, Any], show: dict[str, Any], unit: str) -> dict[str, Any]:
    """`systemctl show -p LoadState,ActiveState UNIT` after the stop → whether the transient unit is gone."""
    values = dict(line.partition("=")[::2] for line in str(show.get("stdout") or "").splitlines() if "=" in line)
    gone = values.get("LoadState") == "not-found" or (values.get("ActiveState") in ("inactive", "failed") \
        and values.get("LoadState") != "loaded")
    return {
        "unit": unit,
        "gone": bool(gone),
        "state": values,
        "stop": {"rc": stop.get("rc"), "output": first_host_trim(_output(stop), 10)},
    }


def first_host_report(layers: list[dict[str, Any]], meta: dict[str, Any],
                      cleanup: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every layer in order (those after the first failure: not reached), the first failed layer, a verdict."""
    by_name = {layer["name"]: layer for layer in layers or []}
    ordered = []
    first_failed = None
    for name in NAMES:
        layer = by_name.get(name)
        if layer is None:
            layer = {"name": name, "title": TITLES[name], "status": "not reached",
                     "summary": f"not reached: {first_failed} failed first" if first_failed else "not reached",
                     "fix": "", "evidence": [], "details": {}}
        if layer["status"] == "failed" and first_failed is None:
            first_failed = name
        ordered.append(layer)
    error = meta.get("error")
    if error and not first_failed:
        verdict = f"the smoke itself failed in task {error.get('task')!r}: {error.get('msg')}"
    elif first_failed:
        number = NAMES.index(first_failed) + 1
        verdict = f"failed at layer {number} ({first_failed}): {by_name[first_failed]['summary']}"
    elif any(layer["status"] == "check mode" for layer in ordered):
        verdict = "check mode: every layer that ran passed; the server and probe were not run"
    elif any(layer["status"] == "skipped" for layer in ordered):
        verdict = "passed, with layers skipped: " + ", ".join(
            layer["name"] for layer in ordered if layer["status"] == "skipped")
    else:
        verdict = "passed: every layer"
    return {
        **meta,
        "first_failed": first_failed,
        "passed": first_failed is None and not error,
        "verdict": verdict,
        "layers": ordered,
        "cleanup": cleanup,
    }


_MARK = {"passed": "passed", "failed": "**FAILED**", "not reached": "not reached", "skipped": "skipped",
         "check mode": "not run (check mode)"}


def first_host_report_md(report: dict[str, Any]) -> str:
    """The report as Markdown: a table of the layers, then each layer's evidence."""
    out = [f"# First-host smoke: {report.get('host')} ({report.get('time')})", ""]
    out.append(f"Inventory: `{report.get('inventory')}` · verdict: **{report['verdict']}**")
    out.append("")
    if report.get("note"):
        out += [f"> {report['note']}", ""]
    if report.get("first_failed"):
        failed = next(layer for layer in report["layers"] if layer["name"] == report["first_failed"])
        out += [f"First failed layer: **{failed['name']}**. Fix: {failed['fix']}", ""]
    out += ["| # | layer | checks | result | what it found |", "|---|---|---|---|---|"]
    for index, layer in enumerate(report["layers"], 1):
        summary = layer["summary"].replace("|", "\\|").replace("\n", " ")
        out.append(f"| {index} | {layer['name']} | {layer['title']} | {_MARK[layer['status']]} | {summary} |")
    out.append("")
    cleanup = report.get("cleanup")
    if cleanup:
        state = ", ".join(f"{k}={v}" for k, v in sorted(cleanup.get("state", {}).items()))
        out += [f"Transient server unit `{cleanup['unit']}`: "
                + ("stopped, gone" if cleanup.get("gone") else "**still loaded**") + f" ({state}).", ""]
    for index, layer in enumerate(report["layers"], 1):
        if not layer["evidence"]:
            continue
        out += [f"## {index}. {layer['name']}: {_MARK[layer['status']]}", ""]
        for item in layer["evidence"]:
            rc = "" if item.get("rc") is None else f" (exit {item['rc']})"
            out.append(f"`{item['command']}`{rc}")
            out.append("")
            if item.get("output"):
                out += ["```", item["output"].replace("```", "'''"), "```", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def first_host_is_loopback(address: str) -> bool:
    """True for an address in 127.0.0.0/8 or ::1 (the transient server serves only the host itself)."""
    try:
        return ipaddress.ip_address(str(address).strip("[]")).is_loopback
    except ValueError:
        return False


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "first_host_trim": first_host_trim,
            "first_host_json_line": lambda text: _json_line(text) or {},
            "first_host_rocminfo_agents": first_host_rocminfo_agents,
            "first_host_driver_layer": first_host_driver_layer,
            "first_host_rocminfo_layer": first_host_rocminfo_layer,
            "first_host_torch_layer": first_host_torch_layer,
            "first_host_kernel_layer": first_host_kernel_layer,
            "first_host_server_layer": first_host_server_layer,
            "first_host_probe_layer": first_host_probe_layer,
            "first_host_skipped_layer": first_host_skipped_layer,
            "first_host_go": first_host_go,
            "first_host_skipped_layers": first_host_skipped_layers,
            "first_host_systemd_run": first_host_systemd_run,
            "first_host_cleanup": first_host_cleanup,
            "first_host_report": first_host_report,
            "first_host_report_md": first_host_report_md,
            "first_host_is_loopback": first_host_is_loopback,
        }
