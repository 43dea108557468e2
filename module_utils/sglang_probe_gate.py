# hicache-fleet: the gate of the cold/warm TTFT probe: thresholds and baselines.
# Plain functions, unit-tested in tests/probe; the module library/sglang_cache_probe.py uses them.
# Runs on the managed host with its system Python: standard library and ansible.module_utils only.

from __future__ import annotations

import json
import math
from typing import Any

from ansible.module_utils.common.validation import check_type_path
from ansible.module_utils.sglang_pool_plan import pool_gate_checks
from ansible.module_utils.sglang_probe_client import ProbeError


def round_down_to_page(tokens: float, page_size: int) -> int:
    page = max(int(page_size or 1), 1)
    return math.floor(tokens / page) * page


def required_cached_tokens(fraction: float, input_len: int, page_size: int) -> int:
    """Cached tokens a warm hit must show: fraction x input_len rounded down to whole pages, capped
    at what a server can cache at all (the last prompt token is always recomputed)."""
    wanted = round_down_to_page(fraction * input_len, page_size)
    cacheable = round_down_to_page(max(input_len - 1, 0), page_size)
    return max(min(wanted, cacheable), 0)


def load_baseline(baseline: Any) -> dict | None:
    """A baseline as a dict: a registered result, a report record, or a path to a report JSON."""
    if baseline is None or baseline == "" or baseline == {}:
        return None
    if isinstance(baseline, str):
        text = baseline.strip()
        if text.startswith("{"):
            source = "the baseline string"
        else:
            source = baseline
            try:
                with open(check_type_path(baseline), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError as exc:
                raise ProbeError(
                    f"cannot read baseline file {baseline}: {exc.strerror}; pass the report_path of an "
                    "earlier run or its registered result."
                ) from exc
        try:
            baseline = json.loads(text)
        except ValueError as exc:
            raise ProbeError(f"{source} is not valid JSON ({exc}).") from exc
    if not isinstance(baseline, dict):
        raise ProbeError(
            "baseline must be a dict (an earlier result of this module or its report JSON) or the path "
            "of a report JSON file."
        )
    cold = baseline.get("cold")
    if not isinstance(cold, dict) or not isinstance(cold.get("median_ttft_ms"), (int, float)):
        raise ProbeError(
            "baseline has no cold.median_ttft_ms: pass the registered result of an earlier "
            "sglang_cache_probe run or the JSON it wrote to report_path."
        )
    return baseline


def baseline_input_len(baseline: dict) -> int | None:
    """The prompt length a baseline was measured with (a rollout record, a report or a result)."""
    for value in (baseline.get("input_len"), baseline.get("random_input_len"),
                  (baseline.get("cold") or {}).get("random_input_len"),
                  (baseline.get("plan") or {}).get("input_len")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def comparable_baseline(baseline: dict, input_len: int) -> dict:
    """The baseline's median TTFTs (ms) as expected at input_len, and what could not be compared.

    Same prompt length (or unknown): every figure. Longer: the cold TTFT scaled by
    input_len / base_len (the prefill cost per token grows with the prompt, so where prefill
    dominates the TTFT the scaled figure overstates what a healthy server takes), warm figures left
    out (a warm hit's time is mostly not proportional to the prompt). Shorter: nothing (scaling up
    would understate it)."""
    source = baseline.get("source") if isinstance(baseline.get("source"), str) else "the baseline"
    base_len = baseline_input_len(baseline)
    out: dict = {"source": source, "input_len": base_len, "scale": 1.0, "cold_ms": None, "warm_ms": {},
                 "note": None}
    cold_ms = (baseline.get("cold") or {}).get("median_ttft_ms")
    warm = {tier: (case or {}).get("median_ttft_ms") for tier, case in (baseline.get("warm") or {}).items()
            if isinstance(case, dict)}
    warm = {tier: ms for tier, ms in warm.items() if isinstance(ms, (int, float)) and ms > 0}
    if base_len is None or base_len == input_len:
        out["cold_ms"] = cold_ms if isinstance(cold_ms, (int, float)) and cold_ms > 0 else None
        out["warm_ms"] = warm
    elif base_len > input_len:
        out["scale"] = round(input_len / base_len, 6)
        if isinstance(cold_ms, (int, float)) and cold_ms > 0:
            out["cold_ms"] = round(cold_ms * input_len / base_len, 3)
        out["note"] = (f"{source} was measured with input_len {base_len}: its cold TTFT is scaled to "
                       f"{input_len} tokens, its warm TTFTs are not compared")
    else:
        out["note"] = (f"{source} was measured with input_len {base_len}, shorter than this run's "
                       f"{input_len}: not compared")
    return out


def _duration(ms: float) -> str:
    return f"{ms / 1000.0:.3g} s" if ms >= 1000 else f"{ms:.3g} ms"


def evaluate_gate(result: dict, p: dict, baseline: dict | None = None) -> dict:
    """Every check with its figure; reasons lists the violated ones, one sentence each."""
    checks: list[dict] = []
    input_len = p["input_len"]
    page = (result.get("server") or {}).get("page_size") or 1
    cold = result.get("cold") or {}
    server = result.get("server") or {}

    def check(name: str, ok: bool, value: Any, limit: Any, reason: str) -> None:
        checks.append({"name": name, "passed": ok, "value": value, "limit": limit,
                       "reason": None if ok else reason})

    for tier, case in (result.get("warm") or {}).items():
        warm_ms = case.get("median_ttft_ms")
        if p.get("max_warm_ttft_s") is not None and warm_ms is not None:
            limit = p["max_warm_ttft_s"]
            check(f"{tier}.max_warm_ttft_s", warm_ms / 1000.0 <= limit, round(warm_ms / 1000.0, 4),
                  limit, f"warm ({tier}) median TTFT {warm_ms / 1000.0:.3f} s > max_warm_ttft_s {limit:g} s")
        ratio = case.get("warm_cold_ratio")
        if p.get("max_warm_cold_ratio") is not None and ratio is not None:
            limit = p["max_warm_cold_ratio"]
            check(f"{tier}.max_warm_cold_ratio", ratio <= limit, ratio, limit,
                  f"warm ({tier}) / cold TTFT ratio {ratio:.4f} > max_warm_cold_ratio {limit:g} "
                  f"(warm {warm_ms:.1f} ms, cold {cold.get('median_ttft_ms'):.1f} ms)")
        if p.get("min_cached_fraction") is not None:
            need = required_cached_tokens(p["min_cached_fraction"], input_len, page)
            got = case.get("median_cached_tokens") or 0
            hint = ""
            if got == 0 and tier == "host" and not server.get("enable_hierarchical_cache"):
                hint = "; the server runs without --enable-hierarchical-cache"
            check(f"{tier}.min_cached_fraction", got >= need, got, need,
                  f"warm ({tier}) cached tokens {got} < {need} required (min_cached_fraction "
                  f"{p['min_cached_fraction']:g} of input_len {input_len}, page size {page}){hint}")
        if tier == "host" and p.get("min_host_cached_fraction") is not None:
            need = required_cached_tokens(p["min_host_cached_fraction"], input_len, page)
            got = case.get("median_host_cached_tokens") or 0
            if server.get("enable_hierarchical_cache"):
                hint = ("; HiCache is on but the prefix did not come back from host memory (host pool too "
                        "small, or evicted from it by the fillers: lower filler_factor or raise --hicache-size)")
            else:
                hint = "; the server runs without --enable-hierarchical-cache, so it has no host tier"
            check("host.min_host_cached_fraction", got >= need, got, need,
                  f"warm (host) host-cached tokens {got} < {need} required (min_host_cached_fraction "
                  f"{p['min_host_cached_fraction']:g} of input_len {input_len}){hint}")

        if tier == "storage" and p.get("min_storage_cached_fraction") is not None:
            need = required_cached_tokens(p["min_storage_cached_fraction"], input_len, page)
            got = case.get("median_storage_cached_tokens") or 0
            check("storage.min_storage_cached_fraction", got >= need, got, need,
                  f"warm (storage) storage-cached tokens {got} < {need} required (min_storage_cached_fraction "
                  f"{p['min_storage_cached_fraction']:g} of input_len {input_len}); the "
                  f"{server.get('hicache_storage_backend')} storage tier did not give the prefix back after "
                  "/flush_cache (not written yet: raise storage_write_wait_s; or its size limit evicted it)")
    checks.extend(storage_checks(result, p, page))

    compared = None
    if baseline is not None:
        compared = comparable_baseline(baseline, input_len)
        regression = float(p.get("max_regression") or 0.0)
        slack = float(p.get("regression_slack_ms") or 0.0)
        pairs = [("cold", "cold", cold, compared["cold_ms"])]
        for tier, case in (result.get("warm") or {}).items():
            pairs.append((tier, f"warm ({tier})", case, compared["warm_ms"].get(tier)))
        scaled = (f" scaled from {compared['input_len']} to {input_len} tokens"
                  if compared["scale"] != 1.0 else "")
        for name, label, case, base_ms in pairs:
            now_ms = case.get("median_ttft_ms")
            if not isinstance(now_ms, (int, float)) or base_ms is None:
                continue
            limit = round(base_ms * (1.0 + regression) + slack, 3)
            check(f"{name}.max_regression", now_ms <= limit, now_ms, limit,
                  f"{label} TTFT {_duration(now_ms)} is {now_ms / base_ms:.1f}× {compared['source']} "
                  f"({_duration(base_ms)}{scaled}); the limit is {_duration(limit)} (max_regression "
                  f"{regression:g}, regression_slack_ms {slack:g})")

    checks.extend(parity_checks(result.get("parity")))
    checks.extend(pool_gate_checks(result))  # issue 25 item 2 (module_utils/sglang_pool_plan.py)
    reasons = [c["reason"] for c in checks if not c["passed"]]
    gate = {"enabled": bool(p.get("gate", True)), "passed": not reasons, "reasons": reasons, "checks": checks}
    if compared is not None:
        gate["baseline"] = compared
    return gate


def storage_checks(result: dict, p: dict, page: int) -> list[dict]:
    """Issue 27 item 2: tier storage asked alone of a server without a storage backend fails (tier all
    then measures device and host only); min_restart_storage_fraction gates the restart re-read."""
    checks = []
    storage = result.get("storage") or {}
    if p.get("tier") == "storage" and storage and not storage.get("measured"):
        checks.append({"name": "storage.backend", "passed": False, "value": storage.get("backend"), "limit": None,
                       "reason": "tier storage was asked, but the server runs without --hicache-storage-backend "
                                 "(no hicache_storage_backend in /get_server_info): turn the storage tier on, or "
                                 "probe tier all (which then measures device and host only)"})
    need_fraction = p.get("min_restart_storage_fraction")
    if need_fraction is not None and storage:
        hit = result.get("restart_hit")
        need = required_cached_tokens(need_fraction, p["input_len"], page)
        got = hit.get("storage_cached_tokens") if isinstance(hit, dict) else None
        if got is None:
            reason = ("the restart re-read was not sent: the server runs without a storage backend, so nothing it "
                      "served before the restart can come back from storage")
        else:
            reason = (f"restart re-read: {got} tokens came back from storage < {need} required "
                      f"(min_restart_storage_fraction {need_fraction:g} of input_len {p['input_len']}): the prefix "
                      "served before the restart did not survive it (storage directory changed or emptied, or "
                      "the previous run did not read the seed prompt)")
        checks.append({"name": "restart.min_restart_storage_fraction", "passed": got is not None and got >= need,
                       "value": got, "limit": need, "reason": None if got is not None and got >= need else reason})
    return checks


# ---------------------------------------------------------------------------------------------------
# Answer parity: the warm read must answer what the cold read answered (kept apart from the
# thresholds above). Both reads are greedy; the prompt is a random block repeated, which a language
# model copies, so its next tokens are near-certain and a recomputed and a cached prefix give the same
# greedy tokens although GPUs are not bit-exact between them. Log-probabilities are compared within a
# tolerance, never as exact floats.
# ---------------------------------------------------------------------------------------------------


def _numbers(values: Any, n: int, kind: type) -> list | None:
    if not isinstance(values, list):
        return None
    out = []
    for value in values[:n]:
        if value is None and kind is float:
            out.append(None)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(round(float(value), 4) if kind is float else int(value))
        else:
            return None
    return out


def compare_outputs(cold_ids: Any, cold_logprobs: Any, warm_ids: Any, warm_logprobs: Any, tokens: int,
                    tolerance: float, tier: str) -> dict:
    """The warm answer against the cold one over the first `tokens` output tokens.

    status: equal (every id equal, and every logprob both reads returned within tolerance),
    diverged (position: the first output token, counted from 0, where the ids differ or the logprobs
    differ by more than tolerance), or not_checkable (a read returned no ids, or fewer than `tokens`
    while the ids it did return agree). Logprobs are compared only where both reads returned them;
    logprobs_compared says whether they were."""
    cold = _numbers(cold_ids, tokens, int)
    warm = _numbers(warm_ids, tokens, int)
    cold_lp = _numbers(cold_logprobs, tokens, float)
    warm_lp = _numbers(warm_logprobs, tokens, float)
    out: dict = {"tier": tier, "tokens": tokens, "tolerance": tolerance, "status": "equal", "position": None,
                 "cause": None, "cold": {"ids": cold, "logprobs": cold_lp},
                 "warm": {"ids": warm, "logprobs": warm_lp}, "logprobs_compared": False,
                 "max_logprob_diff": None, "note": None}
    if cold is None or warm is None:
        which = "cold and warm" if cold is None and warm is None else ("cold" if cold is None else "warm")
        out.update(status="not_checkable", note=f"the {which} read returned no output token ids (output_ids)")
        return out
    for k, (a, b) in enumerate(zip(cold, warm, strict=False)):
        if a != b:
            out.update(status="diverged", position=k, cause="token")
            return out
    both = (cold_lp is not None and warm_lp is not None)
    diffs = []
    if both:
        for k, (a, b) in enumerate(zip(cold_lp, warm_lp, strict=False)):
            if a is None or b is None:
                continue
            diff = abs(a - b)
            diffs.append(diff)
            if diff > tolerance:
                out.update(status="diverged", position=k, cause="logprob", logprobs_compared=True,
                           max_logprob_diff=round(max(diffs), 4))
                return out
    out["logprobs_compared"] = bool(diffs)
    out["max_logprob_diff"] = round(max(diffs), 4) if diffs else None
    if not diffs:
        out["note"] = "ids only: the server returned no output_token_logprobs"
    shortest = min(len(cold), len(warm))
    if shortest < tokens:
        which = "cold" if len(cold) < tokens else "warm"
        out.update(status="not_checkable",
                   note=f"the {which} read returned {shortest} of the {tokens} output tokens compared")
    return out


def summarize_parity(comparisons: dict, tokens: int, tolerance: float) -> dict:
    """Per tier, the comparison of every round folded into one: the first diverging round, else the
    first not checkable one, else equal (with the largest logprob difference seen)."""
    if tokens <= 0:
        return {"enabled": False, "tokens": 0, "tolerance": tolerance, "tiers": {}}
    tiers = {}
    for tier, rounds in comparisons.items():
        if not rounds:
            continue
        order = {"diverged": 0, "not_checkable": 1, "equal": 2}
        index = min(range(len(rounds)), key=lambda i: (order[rounds[i]["status"]], i))
        pick = rounds[index]
        summary = dict(pick)
        summary["round"] = index + 1
        summary["rounds"] = len(rounds)
        diffs = [c["max_logprob_diff"] for c in rounds if c.get("max_logprob_diff") is not None]
        if pick["status"] == "equal":
            summary["max_logprob_diff"] = max(diffs) if diffs else None
            summary["logprobs_compared"] = all(c["logprobs_compared"] for c in rounds)
        tiers[tier] = summary
    return {"enabled": True, "tokens": tokens, "tolerance": tolerance, "tiers": tiers}


def _run(values: list | None) -> str:
    if values is None:
        return "none"
    return "[" + ", ".join("–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
                           for v in values) + "]"


def parity_reason(summary: dict) -> str | None:
    """The sentence of a failed parity check of one tier (None when it passed)."""
    tier, tokens, rnd = summary["tier"], summary["tokens"], summary.get("round", 1)
    if summary["status"] == "equal":
        return None
    if summary["status"] == "not_checkable":
        return (f"warm ({tier}) answer parity over {tokens} tokens could not be checked in round {rnd}: "
                f"{summary['note']}; set parity_tokens 0 (rollout_probe_parity_tokens: 0) to probe without it")
    k = summary["position"]
    cold, warm = summary["cold"], summary["warm"]
    if summary["cause"] == "token":
        return (f"warm ({tier}) answer differs from the cold one at output token {k} (round {rnd}, temperature 0): "
                f"cold ids {_run(cold['ids'])}, warm ids {_run(warm['ids'])}")
    a, b = cold["logprobs"][k], warm["logprobs"][k]
    return (f"warm ({tier}) logprob of output token {k} differs from the cold one by {abs(a - b):.3f} > "
            f"parity_logprob_tolerance {summary['tolerance']:g} (round {rnd}; same ids {_run(cold['ids'])}): "
            f"cold logprobs {_run(cold['logprobs'])}, warm logprobs {_run(warm['logprobs'])}")


def parity_checks(parity: dict | None) -> list[dict]:
    """The gate's checks of answer parity, one per warm tier (none when parity is off)."""
    if not parity or not parity.get("enabled"):
        return []
    checks = []
    for tier, summary in parity["tiers"].items():
        reason = parity_reason(summary)
        value = summary["status"] if summary["position"] is None else f"{summary['status']} at {summary['position']}"
        checks.append({"name": f"{tier}.parity", "passed": reason is None, "value": value,
                       "limit": parity["tokens"], "reason": reason})
    return checks
