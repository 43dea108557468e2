"""Filters of playbooks/hicache_sizing.yml (issue 26): the sweep's inputs, plan, resume and figures.

The logic is module_utils/sglang_sizing.py (plan, resume, recommendation, progress; unit-tested in
tests/sizing/); these filters only shape the playbook's data for it and its results for the report
(playbooks/files/hicache_sizing_report.py):

- ``hicache_sizing_input_findings(inputs)``: one sentence per bad sweep variable, naming it and the fix.
- ``hicache_sizing_argv_map(argv)``: a release's argv.json as {flag: value, switch: True}.
- ``hicache_sizing_gpus(rocminfo)``: GPU agents of rocminfo's output (preflight's own parser).
- ``hicache_sizing_plan(host, settings)``: the sweep's plan.json: the host, its facts, the needs and
  every candidate (planned or pruned with its reason), each with the flags it runs and its prefix bound.
- ``hicache_sizing_resume(sweep_dir, plan)``: what a re-run keeps: {done, todo, ignored, elapsed_s,
  router_was_in}.
- ``hicache_sizing_plan_lines(plan, resume)``: the plan as the operator reads it (check mode stops there).
- ``hicache_sizing_probe_figures(probe, candidate, host, mem_available)``: a candidate's result keys from
  the probe's result and MemAvailable with it running.
- ``hicache_sizing_progress(done, total, times, bound_s, last_id, last_status)``: the progress line.
- ``hicache_sizing_error(message)``: a failed candidate's error, short: what failed and what SGLang said.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain-Python use (unit tests without Ansible)
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> Any:
    """A project file by its path (module_utils/ is added to ansible.module_utils, as ansible.cfg does)."""
    import ansible.module_utils

    if str(REPO / "module_utils") not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(str(REPO / "module_utils"))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sizing = _load("hicache_sglang_sizing", REPO / "module_utils" / "sglang_sizing.py")


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number == int(number) else None


def _non_negative(value: Any) -> bool:
    """A finite number >= 0 (a bool is not one)."""
    try:
        return not isinstance(value, bool) and math.isfinite(float(value)) and float(value) >= 0
    except (TypeError, ValueError):
        return False


def input_findings(inputs: Mapping[str, Any]) -> list[str]:
    """The sweep's variables: lists of the right kind, positive bounds, a margin >= 0."""
    out = []
    sizes = inputs.get("sizes_gb")
    if not isinstance(sizes, list) or any(_whole(s) is None or _whole(s) < 1 for s in sizes):
        out.append(f"hicache_sizing_sizes_gb = {sizes!r}: a list of whole GB per TP rank (>= 1; SGLang 0.5.23 takes "
                   "no fraction), or [] for the ladder up to what the host's RAM admits.")
    fractions = inputs.get("mem_fractions")
    bad_fraction = [f for f in fractions or [] if not _fraction(f)] if isinstance(fractions, list) else None
    if bad_fraction is None or bad_fraction:
        out.append(f"hicache_sizing_mem_fractions = {fractions!r}: a list of --mem-fraction-static values between 0 "
                   "and 1 (e.g. ['0.80', '0.85']), or [] for the release's own.")
    for key, variable in (("input_len", "hicache_sizing_input_len"), ("repeats", "hicache_sizing_repeats"),
                          ("max_prefixes", "hicache_sizing_max_prefixes"),
                          ("max_candidates", "hicache_sizing_max_candidates"),
                          ("min_device_tokens", "hicache_sizing_min_device_tokens"),
                          ("max_total_s", "hicache_sizing_max_total_s"),
                          ("candidate_s", "hicache_sizing_candidate_timeout_s")):
        value = _whole(inputs.get(key))
        if value is None or value < 1:
            out.append(f"{variable} = {inputs.get(key)!r}: a whole number >= 1.")
    margin = inputs.get("warm_margin")
    if not _non_negative(margin):
        out.append(f"hicache_sizing_warm_margin = {margin!r}: a number >= 0 (0.25: warm host-tier TTFT within 1.25x "
                   "the best candidate's).")
    slack = inputs.get("warm_slack_ms", 0)
    if not _non_negative(slack):
        out.append(f"hicache_sizing_warm_slack_ms = {slack!r}: a number of milliseconds >= 0 (50: two warm TTFTs "
                   "closer than 50 ms count as equal, whatever their ratio).")
    return out


def _fraction(value: Any) -> bool:
    try:
        return not isinstance(value, bool) and 0 < float(value) < 1
    except (TypeError, ValueError):
        return False


def argv_map(argv: Sequence[Any]) -> dict[str, Any]:
    """argv.json (flag, value, switch, ...) as {flag: value}; a flag without a value is True, one with
    several values keeps the list."""
    out: dict[str, Any] = {}
    flag = None
    for word in argv or []:
        word = str(word)
        if word.startswith("--"):
            flag = word
            out[flag] = True
        elif flag is not None:
            out[flag] = word if out[flag] is True else ([*out[flag], word] if isinstance(out[flag], list)
                                                       else [out[flag], word])
    return out


_preflight = None


def gpus(rocminfo: Any) -> list[dict[str, str]]:
    """GPU agents of rocminfo's output: roles/preflight's parser, the project's one."""
    global _preflight
    if _preflight is None:
        path = REPO / "roles" / "preflight" / "filter_plugins" / "preflight.py"
        _preflight = _load("hicache_preflight_filters", path)
    return _preflight.gpu_agents(rocminfo)


def _fraction_text(value: Any) -> str:
    return f"{float(value):.2f}"


def plan(host: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """plan.json (module_utils/sglang_sizing.py describes it) with each planned candidate's flags
    (`args`) and its prefix bound (`capacity_max_prefixes`: the prefixes the larger pool holds + 2, at
    most hicache_sizing_max_prefixes)."""
    fractions = list(settings.get("mem_fractions") or [])
    if not fractions:
        if not _fraction(host.get("mem_fraction_now")):
            raise AnsibleFilterError(
                f"the release runs no --mem-fraction-static ({host.get('mem_fraction_now')!r}): give the candidates "
                "in hicache_sizing_mem_fractions")
        fractions = [host["mem_fraction_now"]]
    inp = {
        "sizes_gb": [int(s) for s in settings.get("sizes_gb") or []],
        "mem_fractions": [float(f) for f in fractions],
        "tp": int(host["tp"]),
        "mem_total_bytes": int(host["mem_total_bytes"]),
        "mem_available_bytes": int(host["mem_available_bytes"]),
        "reserve_bytes": int(host["reserve_bytes"]),
        "max_candidates": int(settings["max_candidates"]),
    }
    for key in ("kv_bytes_per_token", "mamba_device_bytes", "page_size"):
        if _whole(host.get(key)):
            inp[key] = int(host[key])
    try:
        candidates = sizing.plan_candidates(inp)
    except sizing.SizingError as exc:
        raise AnsibleFilterError(f"hicache_sizing: {exc}") from exc
    input_len = int(settings["input_len"])
    bound = int(settings["max_prefixes"])
    bpt, device_now = _whole(host.get("kv_bytes_per_token")), _whole(host.get("device_tokens_now"))
    mamba, page = _whole(host.get("mamba_device_bytes")), _whole(host.get("page_size")) or 1
    for cand in candidates:
        # Without the L3 tier (the flag dropped): the sweep sizes the RAM tiers, its prefixes would come back
        # from a storage shared by every candidate, and its synthetic fill must not push the host's real
        # pages out of its L3 directory.
        cand["args"] = {"--hicache-size": cand["size_gb"],
                        "--mem-fraction-static": _fraction_text(cand["mem_fraction"]),
                        "--hicache-storage-backend": None}
        predicted = cand.get("host_tokens")
        if not predicted and bpt and device_now:
            # Only the prefix fill's bound: the host pool at today's GPU KV capacity (the hybrid split
            # moves a little with the candidate's --mem-fraction-static).
            share = sizing.kv_share((device_now + page) * bpt, mamba) if mamba else 1.0
            predicted = sizing.host_tokens(bpt, device_now, page, cand["size_gb"], kv_share=share)
        # The cache holds what either pool holds (a small host pool: the GPU's), so the fill passes the
        # larger one by two prefixes (module_utils/sglang_probe_capacity.py counts both tiers).
        largest = max(predicted or 0, device_now or 0, cand.get("device_tokens") or 0)
        cand["capacity_max_prefixes"] = min(bound, largest // input_len + 2) if largest else bound
    return {
        "host": host["host"],
        "release_id": host["release_id"],
        "config_hash": host.get("config_hash", ""),
        "sglang_version": host.get("sglang_version", ""),
        "started": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fleet": settings.get("fleet") or None,
        "ram_source": host["ram_source"],
        "facts": {"mem_total_mb": int(host["mem_total_mb"]), "gpu_model": host["gpu_model"],
                  "gpu_count": int(host["gpu_count"])},
        "hicache_args_now": dict(host.get("hicache_args_now") or {}),
        "needs": {"min_device_tokens": int(settings["min_device_tokens"]),
                  "warm_margin": float(settings["warm_margin"]),
                  "warm_slack_s": float(settings.get("warm_slack_ms", 0)) / 1000,
                  "reserve_bytes": int(host["reserve_bytes"])},
        "input_len": input_len,
        "bound_s": int(settings["max_total_s"]),
        "candidates": candidates,
    }


def resume(sweep_dir: str, plan_: Mapping[str, Any]) -> dict[str, Any]:
    """What a re-run keeps of a sweep of the same release: done ids, the candidates left, why files were
    ignored, the done candidates' times, and whether the host was in the router when the sweep began."""
    summary = sizing.resume_summary(os.path.join(sweep_dir, "results"), plan_)
    elapsed = []
    for cid in summary["done"]:
        try:
            with open(os.path.join(sweep_dir, "results", f"{cid}.json"), encoding="utf-8") as fh:
                elapsed.append(float(json.load(fh).get("elapsed_s") or 0))
        except (OSError, ValueError, TypeError):
            continue
    router_was_in = None
    try:
        with open(os.path.join(sweep_dir, "plan.json"), encoding="utf-8") as fh:
            before = json.load(fh)
        if before.get("release_id") == plan_.get("release_id") and isinstance(before.get("router_was_in"), bool):
            router_was_in = before["router_was_in"]
    except (OSError, ValueError, AttributeError):
        pass
    return {**summary, "elapsed_s": elapsed, "router_was_in": router_was_in}


def plan_lines(plan_: Mapping[str, Any], resume_: Mapping[str, Any]) -> list[str]:
    facts = plan_["facts"]
    lines = [
        f"{plan_['host']}: release {plan_['release_id']}, {facts['mem_total_mb']} MiB RAM ({plan_['ram_source']}), "
        f"{facts['gpu_count']} x {facts['gpu_model']}; prefixes of {plan_['input_len']} tokens; "
        f"class {sizing.host_class(facts)}",
    ]
    done = set(resume_.get("done") or [])
    for cand in plan_["candidates"]:
        if cand["status"] == "pruned":
            state = f"pruned: {cand['reason']}"
        elif cand["id"] in done:
            state = "measured before (kept: this run resumes)"
        else:
            state = f"to measure (prefix fill bound {cand['capacity_max_prefixes']})"
        lines.append(f"{cand['id']}: --hicache-size {cand['size_gb']} --mem-fraction-static "
                     f"{_fraction_text(cand['mem_fraction'])}: {state}")
    lines.extend(resume_.get("ignored") or [])
    return lines


def _ms_to_s(case: Any) -> float | None:
    if isinstance(case, Mapping) and isinstance(case.get("median_ttft_ms"), (int, float)):
        return round(case["median_ttft_ms"] / 1000.0, 4)
    return None


def probe_figures(probe: Mapping[str, Any], candidate: Mapping[str, Any], host: Mapping[str, Any],
                  mem_available: Any) -> dict[str, Any]:
    """A measured candidate's result keys (RESULT_KEYS of module_utils/sglang_sizing.py)."""
    pools = probe.get("pools") or {}
    server = probe.get("server") or {}
    warm = probe.get("warm") or {}
    parity = probe.get("parity") or {}
    tiers = parity.get("tiers") or {}
    capacity = probe.get("capacity") or {}
    pinned = int(candidate["size_gb"]) * 1_000_000_000 * int(host["tp"])
    if host.get("ram_source") == "simulator":
        ram_left = int(host["mem_total_bytes"]) - pinned
    else:
        ram_left = _whole(mem_available)
    return {
        "status": "ok",
        "device_tokens": pools.get("device_tokens", server.get("max_total_num_tokens")),
        "host_tokens": pools.get("host_tokens"),
        "pinned_bytes": pinned,
        "ram_left_bytes": ram_left,
        "cold_ttft_s": _ms_to_s(probe.get("cold")),
        "warm_device_ttft_s": _ms_to_s(warm.get("device")),
        "warm_host_ttft_s": _ms_to_s(warm.get("host")),
        "parity_ok": bool(parity.get("enabled")) and bool(tiers)
        and all((t or {}).get("status") == "equal" for t in tiers.values()),
        "prefixes_held": capacity.get("held"),
        "prefixes_bound_reached": bool(capacity.get("bound_reached")),
        "prefix_len": capacity.get("prefix_len"),
        "sglang_version": server.get("version"),
    }


def error_text(message: Any, limit: int = 600) -> str:
    """A failed candidate's error as the table shows it: the failure's first line, then the last lines of
    the journal that name an error (a traceback's last line: what SGLang said), within `limit`."""
    lines = [line.strip() for line in str(message or "").splitlines() if line.strip()]
    if not lines:
        return "no detail"
    said = [line for line in lines[1:] if any(k in line for k in ("Error", "error:", "Exception", "Not enough"))]
    text = lines[0] if not said else f"{lines[0]} ... {said[-1]}"
    return text if len(text) <= limit else text[: limit // 2] + " ... " + text[-(limit // 2):]


def progress(done: Any, total: Any, times: Sequence[float], bound_s: Any, last_id: str = "",
             last_status: str = "") -> str:
    return sizing.progress_line(int(done), int(total), [float(t) for t in times or []], float(bound_s or 0),
                                last_id, last_status)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "hicache_sizing_input_findings": input_findings,
            "hicache_sizing_argv_map": argv_map,
            "hicache_sizing_gpus": gpus,
            "hicache_sizing_plan": plan,
            "hicache_sizing_resume": resume,
            "hicache_sizing_plan_lines": plan_lines,
            "hicache_sizing_probe_figures": probe_figures,
            "hicache_sizing_progress": progress,
            "hicache_sizing_error": error_text,
        }
