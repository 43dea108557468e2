# hicache-fleet: the sizing sweep's logic (issue 26, "Measured HiCache sizing"). Pure functions.
# Unit-tested in tests/sizing/. Runs on the controller (playbooks/files/hicache_sizing_report.py, the
# sweep playbook): standard library plus the project's sglang_pool_plan.
"""Measured HiCache sizing: plan the candidates, resume a sweep, pick the config, write its group_vars.

The sweep directory (written by playbooks/hicache_sizing.yml, read by hicache_sizing_report.py):

* ``plan.json``: ``{host, release_id, sglang_version, started, fleet, facts: {mem_total_mb, gpu_model,
  gpu_count}, hicache_args_now: {flag: value}, needs: {min_device_tokens, warm_margin, reserve_bytes},
  bound_s, candidates: plan_candidates(...)}``.
* ``results/<id>.json``: one per candidate run, written when it finishes (RESULT_KEYS, plus
  ``release_id`` so that a resumed sweep keeps only results of the same release).

SGLang's own admission rule, read off the pinned wheel (sglang 0.5.23,
site-packages/sglang/srt/mem_cache/pool_host/base.py): ``HostKVCache._allocate_host_buffer`` raises
"Not enough host memory available. Requesting X GB but only have Y GB free" when a rank's pool
(``size * size_per_token``, i.e. its --hicache-size GB) exceeds ``host_memory_budget_bytes()`` =
``(available_host_memory_bytes() - HICACHE_HOST_MEMORY_RESERVE_BYTES) // ranks_per_host()``, where the
available memory is psutil's ``virtual_memory().available`` (MemAvailable) bounded by the cgroup's headroom
(mem_cache/host_memory.py) and the reserve is 10 GiB. Preflight implements the same rule for all ranks
together (roles/preflight/filter_plugins/preflight.py ``mem_available_findings``: pools + 10 GiB within
MemAvailable) and the toolkit's own (``ram_findings``: pools + sglang_service_memory_reserve_gb within MemTotal).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.module_utils.sglang_pool_plan import host_tokens, kv_share

SGLANG_HOST_RESERVE_BYTES = 10 * 1024**3  # HICACHE_HOST_MEMORY_RESERVE_BYTES, sglang 0.5.23
GB = 1e9  # --hicache-size counts whole GB (1e9 bytes) per TP rank
DEFAULT_SIZES_GB = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# RAM classes (GiB of MemTotal); a host within 12 % of one is in it, others round to 8 GiB.
RAM_BUCKETS_GIB = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
RAM_BUCKET_TOLERANCE = 0.12
RESULT_KEYS = (
    "id", "size_gb", "mem_fraction", "status", "error", "start_s", "device_tokens", "host_tokens",
    "pinned_bytes", "ram_left_bytes", "ram_source", "cold_ttft_s", "warm_device_ttft_s", "warm_host_ttft_s",
    "parity_ok", "prefixes_held", "prefixes_bound_reached", "prefix_len", "elapsed_s",
)
STATUSES = ("ok", "failed_start", "pruned", "failed_probe")


class SizingError(ValueError):
    """An input of the sweep is missing or malformed; the message names it and the fix."""


# --- small helpers ------------------------------------------------------------------------------------
def _whole(inp: Mapping[str, Any], key: str, minimum: int = 0) -> int:
    value = inp.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
        raise SizingError(f"{key} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def _whole_or_none(inp: Mapping[str, Any], key: str, minimum: int = 0) -> int | None:
    return None if inp.get(key) is None else _whole(inp, key, minimum)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def _gb(value: float) -> str:
    return f"{value / GB:.1f} GB"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f} ms"


def candidate_id(size_gb: int, mem_fraction: float) -> str:
    """The stable id of a candidate: s<size GB per rank>-f<mem fraction, 2 decimals>, e.g. s16-f0.80."""
    return f"s{int(size_gb)}-f{float(mem_fraction):.2f}"


def _spread(count: int, keep: int) -> list[int]:
    """Indices of `keep` items spread evenly over `count` (first and last included), strictly increasing."""
    if keep >= count:
        return list(range(count))
    if keep <= 1:
        return [0][:keep]
    return [int(k * (count - 1) / (keep - 1) + 0.5) for k in range(keep)]


# --- the plan -------------------------------------------------------------------------------------------
def predicted_device_tokens(inp: Mapping[str, Any], mem_fraction: float) -> int | None:
    """d(f) = d(f0) + (f - f0) x gpu bytes per rank / KV bytes per token (None without the figures).

    Measured on the demo: +0.05 -> +39,322 tokens = 0.05 x 24 GiB / 32,768 B. For a hybrid model the
    Mamba pool takes part of the extra memory too, so this is an upper bound there.
    """
    d0 = inp.get("device_tokens_now")
    f0 = _number(inp.get("mem_fraction_now"))
    gpu = _number(inp.get("gpu_bytes_per_rank"))
    bpt = _number(inp.get("kv_bytes_per_token"))
    if not isinstance(d0, int) or isinstance(d0, bool) or f0 is None or gpu is None or not bpt:
        return None
    return round(d0 + (float(mem_fraction) - f0) * gpu / bpt)


def plan_candidates(inp: Mapping[str, Any]) -> list[dict]:
    """Every --hicache-size x --mem-fraction-static candidate, each "planned" or "pruned" with its reason.

    inp: sizes_gb (whole GB per rank; empty: DEFAULT_SIZES_GB), mem_fractions (floats in (0, 1)), tp,
    mem_total_bytes, mem_available_bytes (with the server stopped: what SGLang will see), reserve_bytes
    (sglang_service_memory_reserve_gb in bytes); optional kv_bytes_per_token, mamba_device_bytes, page_size,
    device_tokens_now + mem_fraction_now + gpu_bytes_per_rank, max_candidates.
    """
    sizes_in = inp.get("sizes_gb") or list(DEFAULT_SIZES_GB)
    if not isinstance(sizes_in, (list, tuple)) or any(
        isinstance(s, bool) or not isinstance(s, (int, float)) or s != int(s) or s < 1 for s in sizes_in
    ):
        raise SizingError(
            f"sizes_gb must be a list of whole GB per rank (>= 1; SGLang 0.5.23 rejects 0.5), got {sizes_in!r}"
        )
    fractions_in = inp.get("mem_fractions")
    if not isinstance(fractions_in, (list, tuple)) or not fractions_in or any(
        _number(f) is None or not 0 < float(f) < 1 for f in fractions_in
    ):
        raise SizingError(f"mem_fractions must be a non-empty list of numbers between 0 and 1, got {fractions_in!r}")
    tp = _whole(inp, "tp", 1)
    mem_total = _whole(inp, "mem_total_bytes", 1)
    available = _whole(inp, "mem_available_bytes", 0)
    reserve = _whole(inp, "reserve_bytes", 0)
    bound = _whole_or_none(inp, "max_candidates", 1)
    bpt = _whole_or_none(inp, "kv_bytes_per_token", 1)
    page = _whole_or_none(inp, "page_size", 1) or 1
    mamba = _number(inp.get("mamba_device_bytes"))

    sizes = sorted({int(s) for s in sizes_in})
    fractions = sorted({round(float(f), 4) for f in fractions_in})
    sglang_budget = (available - SGLANG_HOST_RESERVE_BYTES) // tp  # per rank, base.py host_memory_budget_bytes
    out: list[dict] = []
    for size in sizes:
        for fraction in fractions:
            pool = int(size * GB * tp)
            device = predicted_device_tokens(inp, fraction)
            host = None
            if bpt:
                if mamba is None:
                    host = host_tokens(bpt, device or 0, page, size)
                elif device is not None:
                    host = host_tokens(bpt, device, page, size, kv_share=kv_share((device + page) * bpt, mamba))
            # What one rank requests: a dense model's host pool is whole pages plus one padding page of
            # KV (base.py: size * size_per_token), a little over --hicache-size; otherwise the GB asked.
            requested = host * bpt if host is not None and bpt and mamba is None else size * GB
            reasons = []
            if requested > sglang_budget:
                reasons.append(
                    f"SGLang's admission rule: {tp} x {size} GB = {_gb(pool)} pinned, but SGLang admits "
                    f"(MemAvailable {_gb(available)} - its 10 GiB reserve) / {tp} ranks = "
                    f"{_gb(max(sglang_budget, 0))} per rank"
                )
            if pool + reserve > mem_total:
                reasons.append(
                    f"the toolkit's RAM reserve: {_gb(pool)} pinned + sglang_service_memory_reserve_gb "
                    f"{_gb(reserve)} > MemTotal {_gb(mem_total)}"
                )
            if device is not None and device < 1:
                reasons.append(f"--mem-fraction-static {fraction:g} leaves no GPU KV pool (predicted {device} tokens)")
            out.append({
                "id": candidate_id(size, fraction),
                "size_gb": size,
                "mem_fraction": fraction,
                "tp": tp,
                "host_pool_bytes": pool,
                "device_tokens": device,
                "host_tokens": host,
                "status": "pruned" if reasons else "planned",
                "reason": "; ".join(reasons),
            })
    planned = [c for c in out if c["status"] == "planned"]
    if bound is not None and len(planned) > bound:
        keep = {planned[i]["id"] for i in _spread(len(planned), bound)}
        for cand in planned:
            if cand["id"] not in keep:
                cand["status"] = "pruned"
                cand["reason"] = (
                    f"over the bound: max_candidates = {bound} keeps a spread (smallest, largest, evenly "
                    f"between) of the {len(planned)} that fit"
                )
    return out


# --- resuming -------------------------------------------------------------------------------------------
def resume_summary(results_dir: str, plan: Mapping[str, Any]) -> dict:
    """{done: [ids], todo: [planned candidates not done], ignored: [one sentence per ignored file]}.

    A result is kept when it names the plan's release_id and a planned candidate's id; anything else
    (another release, a candidate the plan does not run, a file cut short) is ignored and said so.
    """
    release = plan.get("release_id")
    planned = [c for c in plan.get("candidates") or [] if c.get("status") == "planned"]
    ids = {c["id"] for c in planned}
    done: list[str] = []
    ignored: list[str] = []
    names = sorted(os.listdir(results_dir)) if os.path.isdir(results_dir) else []
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(results_dir, name)
        try:
            with open(path, encoding="utf-8") as fh:
                result = json.load(fh)
        except (OSError, ValueError) as exc:
            ignored.append(f"{name}: not a readable result ({exc}); its candidate runs again")
            continue
        if not isinstance(result, Mapping):
            ignored.append(f"{name}: not a result object; its candidate runs again")
            continue
        rid, cid = result.get("release_id"), result.get("id")
        if rid != release:
            ignored.append(f"{name}: measured on release {rid!r}, not this sweep's {release!r}; ignored")
        elif cid not in ids:
            ignored.append(f"{name}: candidate {cid!r} is not planned in this sweep; ignored")
        elif cid not in done:
            done.append(cid)
    return {"done": done, "todo": [c for c in planned if c["id"] not in done], "ignored": ignored}


def resume_state(
    results_dir: str, plan: Mapping[str, Any], notes: list[str] | None = None
) -> tuple[list[str], list[dict]]:
    """(done ids, planned candidates still to run); `notes` (when given) gets why files were ignored."""
    summary = resume_summary(results_dir, plan)
    if notes is not None:
        notes.extend(summary["ignored"])
    return summary["done"], summary["todo"]


# --- the recommendation ---------------------------------------------------------------------------------
def _describe(result: Mapping[str, Any], best: float | None) -> str:
    held = int(result.get("prefixes_held") or 0)
    more = "at least " if result.get("prefixes_bound_reached") else ""
    prefix = result.get("prefix_len")
    prefix_txt = f" of {int(prefix):,} tokens" if isinstance(prefix, int) else ""
    text = f"holds {more}{held} prefixes{prefix_txt}, warm host TTFT {_ms(_number(result.get('warm_host_ttft_s')))}"
    if best is not None:
        text += f" (best {_ms(best)})"
    pinned, left = _number(result.get("pinned_bytes")), _number(result.get("ram_left_bytes"))
    if pinned is not None:
        text += f", {_gb(pinned)} pinned"
    if left is not None:
        text += f", {_gb(left)} left"
    device = result.get("device_tokens")
    if isinstance(device, int):
        text += f", {device:,} GPU KV tokens"
    return text


def recommend(results: Sequence[Mapping[str, Any]], needs: Mapping[str, Any]) -> dict:
    """The config that holds the most reusable prefixes in host RAM within the profile's needs.

    needs: min_device_tokens, warm_margin and warm_slack_s (warm host TTFT within best x (1 + margin) + slack:
    the slack is the timer's noise floor, which a relative margin alone misses when TTFTs are a few ms),
    reserve_bytes.
    Returns {choice: id or None, reasons: {id: sentence}, admissible: [ids], best_warm_host_ttft_s}.
    """
    min_device = _whole(needs, "min_device_tokens", 0)
    reserve = _whole(needs, "reserve_bytes", 0)
    margin = _number(needs.get("warm_margin"))
    if margin is None or margin < 0:
        raise SizingError(f"warm_margin must be a number >= 0 (e.g. 0.25), got {needs.get('warm_margin')!r}")
    slack = _number(needs.get("warm_slack_s", 0))
    if slack is None or slack < 0:
        raise SizingError(f"warm_slack_s must be a number >= 0 (e.g. 0.05), got {needs.get('warm_slack_s')!r}")
    reasons: dict[str, str] = {}
    passing: list[Mapping[str, Any]] = []
    for res in results:
        rid = str(res.get("id"))
        status = res.get("status")
        device, left = res.get("device_tokens"), _number(res.get("ram_left_bytes"))
        if status != "ok":
            why = res.get("error") or res.get("reason") or ""
            reasons[rid] = f"excluded: {status or 'no status'}" + (f" ({why})" if why else "")
        elif res.get("parity_ok") is not True:
            reasons[rid] = "excluded: the answers from the host tier differ from the cold answers (parity failed)"
        elif not isinstance(device, int) or device < min_device:
            reasons[rid] = (
                f"excluded: {device if isinstance(device, int) else 'no'} GPU KV tokens, the profile needs "
                f"{min_device:,} (min_device_tokens)"
            )
        elif left is None or left < reserve:
            reasons[rid] = (
                f"excluded: {'unknown' if left is None else _gb(left)} RAM left with the server running, "
                f"below the reserve {_gb(reserve)} (sglang_service_memory_reserve_gb)"
            )
        elif _number(res.get("warm_host_ttft_s")) is None:
            reasons[rid] = "excluded: no warm TTFT from the host tier was measured"
        else:
            passing.append(res)
    best = min((float(r["warm_host_ttft_s"]) for r in passing), default=None)
    admissible = []
    for res in passing:
        warm = float(res["warm_host_ttft_s"])
        if best is not None and warm > best * (1 + margin) + slack:
            ratio = warm / best if best > 0 else math.inf
            reasons[str(res["id"])] = (
                f"excluded: warm host TTFT {_ms(warm)} is {ratio:.1f}x the best {_ms(best)}, beyond the margin "
                f"of {margin:.0%} + {_ms(slack)}; " + _describe(res, None)
            )
        else:
            admissible.append(res)
    admissible.sort(key=lambda r: (
        -int(r.get("prefixes_held") or 0), _number(r.get("pinned_bytes")) or 0, -int(r.get("device_tokens") or 0),
        str(r.get("id")),
    ))
    choice = admissible[0] if admissible else None
    for res in admissible:
        if choice is None or res is choice:
            reasons[str(res["id"])] = "chosen: " + _describe(res, best)
        else:
            reasons[str(res["id"])] = (
                f"admissible, not chosen: {_describe(res, best)} (the choice {choice['id']} holds "
                f"{int(choice.get('prefixes_held') or 0)}"
                + (", with less pinned RAM or more GPU KV tokens)" if
                   int(res.get("prefixes_held") or 0) == int(choice.get("prefixes_held") or 0) else ")")
            )
    return {
        "choice": None if choice is None else str(choice["id"]),
        "reasons": reasons,
        "admissible": [str(r["id"]) for r in admissible],
        "best_warm_host_ttft_s": best,
    }


# --- the host class and its group_vars ------------------------------------------------------------------
def host_class(facts: Mapping[str, Any]) -> str:
    """The host class: RAM bucket (GiB of MemTotal), GPU model and count, e.g. ram64g_gfx1100x2.

    facts: {mem_total_mb (ansible_memtotal_mb), gpu_model (preflight_gpu_arch, e.g. gfx1100),
    gpu_count (rocminfo's agents of that model, preflight_gpus_found; 0: no GPU)}. Underscores, not
    dashes: the name is an Ansible group name, which allows only letters, digits and underscores.
    """
    mem_mb = _whole(facts, "mem_total_mb", 1)
    count = _whole(facts, "gpu_count", 0)
    gib = mem_mb / 1024
    bucket = min(RAM_BUCKETS_GIB, key=lambda b: abs(math.log(gib / b)))
    if abs(gib - bucket) > bucket * RAM_BUCKET_TOLERANCE:
        bucket = max(8, round(gib / 8) * 8)
    if count == 0:
        return f"ram{bucket}g_nogpu"
    model = re.sub(r"[^a-z0-9]+", "", str(facts.get("gpu_model") or "").lower())
    if not model:
        raise SizingError(
            f"gpu_model must name the GPU (e.g. gfx1100, preflight_gpu_arch), got {facts.get('gpu_model')!r}"
        )
    return f"ram{bucket}g_{model}x{count}"


def _yaml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a JSON string is a YAML double-quoted scalar


def _comment(text: Any) -> str:
    return " ".join(str(text).split())


def _fraction_text(fraction: float) -> str:
    return f"{fraction:.2f}" if round(fraction, 2) == fraction else format(fraction, "g")


def group_vars_text(
    choice_result: Mapping[str, Any], hicache_args_now: Mapping[str, Any], class_name: str,
    evidence: Mapping[str, Any],
) -> str:
    """inventories/<fleet>/group_vars/<class_name>.yml: the host's HiCache args with the chosen size, and
    --mem-fraction-static in sglang_service_args. evidence: host, date, release_id, sglang_version,
    report_path (and optionally fleet, reason)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(class_name)):
        raise SizingError(f"class_name must be an Ansible group name (letters, digits, _), got {class_name!r}")
    size = _whole(choice_result, "size_gb", 1)
    fraction = _number(choice_result.get("mem_fraction"))
    if fraction is None or not 0 < fraction < 1:
        raise SizingError(
            f"the chosen result's mem_fraction must be between 0 and 1, got {choice_result.get('mem_fraction')!r}"
        )
    args = dict(hicache_args_now or {})
    args["--hicache-size"] = size
    fleet = evidence.get("fleet") or "<fleet>"
    lines = [
        "---",
        f"# HiCache sizing for host class {class_name} (RAM, GPU model and count), measured by",
        "# playbooks/hicache_sizing.yml:",
        f"#   host {_comment(evidence.get('host'))}, {_comment(evidence.get('date'))}",
        f"#   release {_comment(evidence.get('release_id'))}, SGLang {_comment(evidence.get('sglang_version'))}",
        f"#   report {_comment(evidence.get('report_path'))}",
        f"#   candidate {_comment(choice_result.get('id'))}",
    ]
    if evidence.get("reason"):  # wrapped: yamllint's line-length (140) applies to the committed file
        lines += textwrap.wrap(_comment(evidence["reason"]), 110, initial_indent="#   ", subsequent_indent="#     ",
                               break_long_words=False, break_on_hyphens=False)
    lines += [
        f"# Put the class's hosts in group {class_name} of inventories/{_comment(fleet)}, commit this file as",
        f"# inventories/{_comment(fleet)}/group_vars/{class_name}.yml and roll it out through the gate (site.yml).",
        "sglang_service_hicache_args:",
    ]
    lines += [f"  {flag}: {_yaml_value(value)}" for flag, value in args.items()]
    lines += [
        "sglang_service_args:",
        # As the profiles write it ("0.80"): two decimals unless the value needs more.
        f"  --mem-fraction-static: {_yaml_value(_fraction_text(fraction))}",
    ]
    return "\n".join(lines) + "\n"


# --- progress -------------------------------------------------------------------------------------------
def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {sec} s" if sec else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def progress_line(
    done: int, total: int, elapsed_list_s: Sequence[float], bound_s: float | None = None,
    last_id: str = "", last_status: str = "",
) -> str:
    """One line per finished candidate: which, how long, and what is left (median x left), never negative;
    says when the total-time bound (bound_s, 0/None: none) will stop the sweep before the end."""
    done, total = max(0, int(done)), max(0, int(total))
    times = [max(0.0, float(t)) for t in elapsed_list_s or []]
    spent = sum(times)
    last = f" {last_id}" if last_id else ""
    status = f" {last_status}" if last_status else ""
    took = f" in {_duration(times[-1])}" if times else ""
    head = f"candidate {done}/{total}{last}{status}{took}"
    left = max(0, total - done)
    if left == 0:
        return f"{head}; sweep done in {_duration(spent)}"
    if not times:
        return f"{head}; {left} left, no estimate yet"
    median = statistics.median(times)
    text = f"{head}; about {_duration(median * left)} left (median {_duration(median)} x {left})"
    if bound_s:
        remaining = max(0.0, float(bound_s) - spent)
        if median * left > remaining:
            fits = int(remaining // median) if median > 0 else left
            text += (
                f"; the {_duration(float(bound_s))} bound stops the sweep after about {min(fits, left)} more "
                f"({_duration(remaining)} left of it)"
            )
    return text
