# hicache-fleet: measurement and statistics of the cold/warm TTFT probe.
# Plain functions, unit-tested in tests/probe; the module library/sglang_cache_probe.py uses them.
# Runs on the managed host with its system Python: standard library and ansible.module_utils only.

from __future__ import annotations

import fcntl
import json
import math
import os
import statistics
import time
from collections.abc import Callable

from ansible.module_utils.sglang_pool_plan import check_pools, read_model_config
from ansible.module_utils.sglang_probe_capacity import (
    capacity_plan_steps,
    measure_capacity,
    resolve_capacity_prefixes,
    validate_capacity_params,
)
from ansible.module_utils.sglang_probe_client import (
    MissingAccounting,
    ProbeError,
    SGLangClient,
    flush_cache,
    generate_body,
    generate_ids,
    repeated_block_ids,
    safe_text,
    wait_until_healthy,
)
from ansible.module_utils.sglang_probe_gate import compare_outputs, summarize_parity

DEFAULT_VOCAB_SIZE = 32000
TIERS = ("device", "host")
ALL_TIERS = ("device", "host", "storage")
MAX_FILLERS = 512
# The probe prompt is one seeded random block of this many ids, repeated to input_len: a language
# model copies a block it has seen, so its greedy next tokens are near-certain (answer parity).
PROMPT_BLOCK_LEN = 256


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


# The module's options (library/sglang_cache_probe.py documents each).
ARGUMENT_SPEC = {
    "url": {"type": "str", "default": "http://127.0.0.1:30000"},
    "api_key": {"type": "str", "no_log": True},
    "admin_api_key": {"type": "str", "no_log": True},
    "input_len": {"type": "int", "default": 128000},
    "cold_output_len": {"type": "int", "default": 512},
    "warm_output_len": {"type": "int", "default": 16},
    "seed": {"type": "int", "default": 42},
    "repeats": {"type": "int", "default": 3},
    "temperature": {"type": "float", "default": 0.0},
    "tier": {"type": "str", "default": "both", "choices": ["device", "host", "storage", "both", "all"]},
    "vocab_size": {"type": "int"},
    "filler_factor": {"type": "float", "default": 1.0},
    "ready_timeout": {"type": "float", "default": 900.0},
    "flush_timeout": {"type": "float", "default": 120.0},
    "request_timeout": {"type": "float", "default": 900.0},
    "max_warm_ttft_s": {"type": "float"},
    "max_warm_cold_ratio": {"type": "float", "default": 0.2},
    "min_cached_fraction": {"type": "float", "default": 0.9},
    "min_host_cached_fraction": {"type": "float", "default": 0.8},
    "min_storage_cached_fraction": {"type": "float", "default": 0.8},
    "storage_write_wait_s": {"type": "float", "default": 2.0},
    "storage_reread_first": {"type": "bool", "default": False},
    "min_restart_storage_fraction": {"type": "float"},
    "baseline": {"type": "raw"},
    "max_regression": {"type": "float", "default": 0.25},
    "regression_slack_ms": {"type": "float", "default": 0.0},
    "gate": {"type": "bool", "default": True},
    "report_path": {"type": "path"},
    "progress_path": {"type": "path"},
    "lock_path": {"type": "path"},
    "lock_timeout": {"type": "float", "default": 3600.0},
    "parity_tokens": {"type": "int", "default": 8, "no_log": False},  # a count of output tokens, no secret
    "parity_logprob_tolerance": {"type": "float", "default": 0.5},
    "capacity_max_prefixes": {"type": "raw", "default": 0},
    "capacity_timeout_s": {"type": "float", "default": 3600.0},
}


def validate_params(p: dict) -> list[str]:
    """Every option combination that makes no sense, one sentence each."""
    errors = []
    for name in ("input_len", "cold_output_len", "warm_output_len", "repeats"):
        if p.get(name) is not None and p[name] < 1:
            errors.append(f"{name} must be at least 1 (got {p[name]}).")
    for name in ("ready_timeout", "flush_timeout", "request_timeout", "filler_factor", "lock_timeout"):
        if p.get(name) is not None and p[name] <= 0:
            errors.append(f"{name} must be greater than 0 (got {p[name]}).")
    if p.get("vocab_size") is not None and p["vocab_size"] < 2:
        errors.append(f"vocab_size must be at least 2 (got {p['vocab_size']}).")
    if p.get("temperature") is not None and p["temperature"] < 0:
        errors.append(f"temperature must be >= 0 (got {p['temperature']}).")
    if p.get("max_warm_ttft_s") is not None and p["max_warm_ttft_s"] <= 0:
        errors.append(f"max_warm_ttft_s must be greater than 0 seconds (got {p['max_warm_ttft_s']}).")
    if p.get("max_warm_cold_ratio") is not None and p["max_warm_cold_ratio"] <= 0:
        errors.append(
            f"max_warm_cold_ratio must be greater than 0 (got {p['max_warm_cold_ratio']}); a warm "
            "request cannot take less than no time. Use e.g. 0.2 (warm at most a fifth of cold)."
        )
    for name in ("min_cached_fraction", "min_host_cached_fraction", "min_storage_cached_fraction",
                 "min_restart_storage_fraction"):
        value = p.get(name)
        if value is not None and not 0 <= value <= 1:
            errors.append(
                f"{name} must be between 0 and 1 (got {value}); it is a fraction of input_len."
            )
    if p.get("max_regression") is not None and p["max_regression"] < 0:
        errors.append(f"max_regression must be >= 0 (got {p['max_regression']}).")
    if p.get("regression_slack_ms") is not None and p["regression_slack_ms"] < 0:
        errors.append(f"regression_slack_ms must be >= 0 (got {p['regression_slack_ms']}).")
    wait = p.get("storage_write_wait_s")
    if wait is not None and not (wait >= 0 and math.isfinite(wait)):
        errors.append(f"storage_write_wait_s must be a number of seconds >= 0 (got {wait}).")
    if p.get("min_restart_storage_fraction") is not None and not p.get("storage_reread_first"):
        errors.append("min_restart_storage_fraction gates the re-read of storage_reread_first, which is off: set "
                      "storage_reread_first true, or leave min_restart_storage_fraction unset.")
    errors.extend(validate_parity_params(p))
    errors.extend(validate_capacity_params(p))
    return errors


def validate_parity_params(p: dict) -> list[str]:
    """The answer-parity options (kept apart from the other checks)."""
    errors = []
    tokens = p.get("parity_tokens")
    if tokens is not None and not 0 <= tokens <= 4096:
        errors.append(f"parity_tokens must be between 0 and 4096 (got {tokens}); 0 turns the answer-parity "
                      "check off, e.g. 8 compares the first 8 output tokens of the warm and the cold read.")
    tolerance = p.get("parity_logprob_tolerance")
    if tolerance is not None and not (tolerance >= 0 and math.isfinite(tolerance)):
        errors.append(f"parity_logprob_tolerance must be a number >= 0 in nats (got {tolerance}), e.g. 0.5.")
    if tokens and p.get("temperature"):
        errors.append(f"temperature must be 0 while parity_tokens is {tokens} (got {p['temperature']:g}): "
                      "sampled answers differ between reads. Set temperature 0, or parity_tokens 0.")
    return errors


def parity_output_lens(p: dict) -> tuple[int, int]:
    """(cold, warm) output lengths: each at least parity_tokens."""
    tokens = p.get("parity_tokens") or 0
    return max(p["cold_output_len"], tokens), max(p["warm_output_len"], tokens)


def parity_comparisons(rounds: list[dict], tiers: list[str], p: dict) -> dict:
    """Each round's warm answer per tier against that round's cold answer (compare_outputs)."""
    tokens = p.get("parity_tokens") or 0
    if tokens <= 0:
        return summarize_parity({}, 0, p.get("parity_logprob_tolerance"))
    tolerance = float(p.get("parity_logprob_tolerance") or 0.0)
    compared = {tier: [] for tier in tiers}
    for runs in rounds:
        cold = runs["cold"]
        for tier in tiers:
            warm = runs[tier]
            compared[tier].append(compare_outputs(cold.get("output_ids"), cold.get("output_logprobs"),
                                                  warm.get("output_ids"), warm.get("output_logprobs"),
                                                  tokens, tolerance, tier))
    return summarize_parity(compared, tokens, tolerance)


def tiers_of(tier: str) -> list[str]:
    """The tiers an option value names: both = device and host, all = device, host and storage."""
    if tier == "both":
        return list(TIERS)
    if tier == "all":
        return list(ALL_TIERS)
    return [tier]


def filler_lengths(
    capacity: int, input_len: int, factor: float, max_input_len: int | None = None
) -> list[int]:
    """Token counts of the filler requests that push a prefix out of a device pool of `capacity`."""
    if not capacity or capacity < 1:
        raise ProbeError(
            "the server does not report its device KV capacity (max_total_num_tokens in "
            "/get_server_info), so the fillers for tier host cannot be sized; use tier device."
        )
    per_request = input_len
    if max_input_len:
        per_request = min(per_request, int(max_input_len) - 1)
    per_request = max(per_request, 1)
    total = math.ceil(capacity * factor)
    count = math.ceil(total / per_request)
    if count > MAX_FILLERS:
        raise ProbeError(
            f"pushing {total} tokens out of the device pool would take {count} filler requests of "
            f"{per_request} tokens (more than {MAX_FILLERS}); raise input_len or lower filler_factor."
        )
    lengths = [per_request] * (count - 1)
    lengths.append(total - per_request * (count - 1))
    return lengths


def plan_steps(p: dict) -> list[str]:
    steps = [
        f"wait up to {p['ready_timeout']:g} s for GET /health_generate to answer 200",
        "GET /get_server_info and /get_model_info (version, page size, device capacity, HiCache)",
    ]
    rnd = [
        f"POST /flush_cache (retried up to {p['flush_timeout']:g} s while busy)",
        f"cold: POST /generate {p['input_len']} ids (a random block of {PROMPT_BLOCK_LEN}, seed {p['seed']}, "
        f"repeated) -> {parity_output_lens(p)[0]} tokens",
    ]
    tiers = tiers_of(p["tier"])
    if "device" in tiers:
        rnd.append(f"warm device: the same {p['input_len']} ids -> {parity_output_lens(p)[1]} tokens")
    if "host" in tiers:
        rnd.append(
            f"fillers: {p['filler_factor']:g} x the device KV capacity (max_total_num_tokens) in "
            "requests of other random ids -> 1 token each"
        )
        rnd.append(f"warm host: the same {p['input_len']} ids -> {parity_output_lens(p)[1]} tokens")
    if "storage" in tiers:
        rnd.append(f"storage (only when the server reports hicache_storage_backend): wait "
                   f"{p.get('storage_write_wait_s') or 0:g} s, POST /flush_cache (clears GPU and host memory, "
                   f"not the storage tier), then the same {p['input_len']} ids -> {parity_output_lens(p)[1]} tokens")
    if p.get("storage_reread_first"):
        steps.append(f"restart re-read (only with a storage backend): the seed {p['seed']} prompt of "
                     f"{p['input_len']} ids, no flush first -> {parity_output_lens(p)[1]} tokens")
    for i in range(p["repeats"]):
        steps.extend(f"round {i + 1}: {s}" for s in rnd)
    if p.get("parity_tokens"):
        steps.append(f"compare each warm answer with its round's cold one over {p['parity_tokens']} tokens "
                     f"(ids equal, logprobs within {p.get('parity_logprob_tolerance')})")
    steps.extend(capacity_plan_steps(p))
    if p.get("report_path"):
        steps.append(f"write the JSON record to {p['report_path']}")
    return steps


def extract_server_facts(server_info: dict, model_info: dict) -> dict:
    """What the probe needs from /get_server_info and /get_model_info."""
    server_info = server_info if isinstance(server_info, dict) else {}
    model_info = model_info if isinstance(model_info, dict) else {}
    capacity = server_info.get("max_total_num_tokens")
    states = server_info.get("internal_states")
    if not capacity and isinstance(states, list) and states and isinstance(states[0], dict):
        first = states[0]
        usage = first.get("memory_usage") if isinstance(first.get("memory_usage"), dict) else {}
        capacity = first.get("max_total_num_tokens") or usage.get("token_capacity")
    hicache_args = {
        k: v
        for k, v in sorted(server_info.items())
        if k.startswith("hicache_") and (v is None or isinstance(v, (str, int, float, bool)))
    }
    hicache_args = {safe_text(k, 80): safe_text(v, 200) if isinstance(v, str) else v for k, v in hicache_args.items()}
    page_size = server_info.get("page_size")
    if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1):
        raise ProbeError(f"the server reported page_size = {safe_text(json.dumps(page_size), 40)}, not a page size "
                         "in tokens (a whole number >= 1); the probe does not gate on it.")
    if isinstance(capacity, (int, float)) and not isinstance(capacity, bool) and capacity < 0:
        raise ProbeError(f"the server reported max_total_num_tokens = {capacity:g}, a negative device capacity; "
                         "the probe does not gate on it.")

    def shown(value: object) -> object:  # a server's name, as a report and the terminal may show it
        return safe_text(value, 200) if isinstance(value, str) else value

    return {
        "version": shown(server_info.get("version")),
        "model_path": shown(model_info.get("model_path") or server_info.get("model_path")),
        "served_model_name": shown(model_info.get("served_model_name") or server_info.get("served_model_name")),
        "page_size": page_size or 1,
        "max_total_num_tokens": int(capacity) if isinstance(capacity, (int, float)) else None,
        "max_req_input_len": server_info.get("max_req_input_len"),
        "context_length": server_info.get("context_length"),
        "enable_hierarchical_cache": bool(server_info.get("enable_hierarchical_cache")),
        "enable_cache_report": server_info.get("enable_cache_report"),
        "hicache_args": hicache_args,
        # The L3 tier (--hicache-storage-backend, e.g. file): None when the server runs without one.
        "hicache_storage_backend": shown(server_info.get("hicache_storage_backend")) or None,
        "vocab_size_reported": model_info.get("vocab_size") or server_info.get("vocab_size"),
    }


def vocab_from_config(model_path: str | None) -> int | None:
    """vocab_size from the model directory's config.json on this host, if it is readable."""
    config = read_model_config(model_path)
    if config is None:
        return None
    for holder in (config, config.get("text_config") or {}, config.get("llm_config") or {}):
        if isinstance(holder, dict) and isinstance(holder.get("vocab_size"), int):
            return holder["vocab_size"]
    return None


def resolve_vocab_size(option: int | None, facts: dict) -> tuple[int, str]:
    if option:
        return int(option), "option vocab_size"
    reported = facts.get("vocab_size_reported")
    if isinstance(reported, int) and reported > 1:
        return reported, "server model info"
    from_config = vocab_from_config(facts.get("model_path"))
    if from_config:
        return from_config, "config.json in the model directory"
    return DEFAULT_VOCAB_SIZE, f"default {DEFAULT_VOCAB_SIZE} (valid for nearly every model)"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def summarize_case(runs: list[dict], input_len: int, output_len: int) -> dict:
    """One case (cold or a warm tier) in SGLang benchmark key names, medians over the runs."""
    ttfts = [r["ttft_s"] for r in runs]
    e2es = [r["e2e_s"] for r in runs]
    prompts = [r.get("prompt_tokens") or input_len for r in runs]
    throughputs = [p / e for p, e in zip(prompts, e2es, strict=False) if e and e > 0]
    tpots = [
        (r["e2e_s"] - r["ttft_s"]) / (r["completion_tokens"] - 1)
        for r in runs
        if (r.get("completion_tokens") or 0) > 1
    ]
    cached = [r["cached_tokens"] for r in runs]
    hosts = [r["host_cached_tokens"] for r in runs]
    stored = [r.get("storage_cached_tokens") or 0 for r in runs]
    devices = [r["device_cached_tokens"] for r in runs]
    storage = sum(r.get("storage_cached_tokens") or 0 for r in runs)
    total_prompt = sum(prompts)
    total_cached = sum(cached)
    med_cached = median(cached)
    med_host = median(hosts)
    med_storage = median(stored)
    return {
        "completed": len(runs),
        "random_input_len": input_len,
        "random_output_len": output_len,
        "total_input_tokens": total_prompt,
        "total_output_tokens": sum(r.get("completion_tokens") or 0 for r in runs),
        "median_ttft_ms": _ms(median(ttfts)),
        "mean_ttft_ms": _ms(mean(ttfts)),
        "ttfts_ms": [_ms(t) for t in ttfts],
        "median_e2e_latency_ms": _ms(median(e2es)),
        "mean_e2e_latency_ms": _ms(mean(e2es)),
        "e2e_latencies_ms": [_ms(e) for e in e2es],
        "input_throughput": _r(median(throughputs), 2),
        "median_tpot_ms": _ms(median(tpots)),
        "median_cached_tokens": None if med_cached is None else int(med_cached),
        "median_device_cached_tokens": None if not devices else int(median(devices)),
        "median_host_cached_tokens": None if med_host is None else int(med_host),
        "median_storage_cached_tokens": None if med_storage is None else int(med_storage),
        "cached_fraction": None if med_cached is None else _r(med_cached / input_len, 4),
        "host_cached_fraction": None if med_host is None else _r(med_host / input_len, 4),
        "storage_cached_fraction": None if med_storage is None else _r(med_storage / input_len, 4),
        "cache_report": {
            "total_prompt_tokens": total_prompt,
            "total_cached_tokens": total_cached,
            "cache_hit_rate_pct": round(total_cached / total_prompt * 100, 2) if total_prompt else 0.0,
            "device_cached_tokens": sum(devices),
            "host_cached_tokens": sum(hosts),
            "storage_cached_tokens": storage or None,
        },
        "runs": [
            {
                "ttft_ms": _ms(r["ttft_s"]),
                "e2e_latency_ms": _ms(r["e2e_s"]),
                "prompt_tokens": r.get("prompt_tokens"),
                "completion_tokens": r.get("completion_tokens"),
                "cached_tokens": r["cached_tokens"],
                "device_cached_tokens": r["device_cached_tokens"],
                "host_cached_tokens": r["host_cached_tokens"],
                "storage_cached_tokens": r.get("storage_cached_tokens") or 0,
            }
            for r in runs
        ],
    }


def add_warm_ratios(warm: dict, cold: dict) -> None:
    cold_ms = cold.get("median_ttft_ms")
    for case in warm.values():
        warm_ms = case.get("median_ttft_ms")
        if cold_ms and warm_ms is not None:
            case["warm_cold_ratio"] = round(warm_ms / cold_ms, 5)
            case["speedup"] = round(cold_ms / warm_ms, 2) if warm_ms > 0 else None
        else:
            case["warm_cold_ratio"] = None
            case["speedup"] = None


def missing_accounting_message(client: SGLangClient, facts: dict) -> str:
    flag = facts.get("enable_cache_report")
    state = ("its /get_server_info says enable_cache_report is false" if flag is False
             else "it does not report enable_cache_report" if flag is None
             else "although it reports enable_cache_report true")
    return (f"the /generate response of {client.url} carries no meta_info.cached_tokens, so cache hits "
            f"cannot be verified ({state}): start the server with --enable-cache-report, or point url at "
            "an SGLang server (the endpoint may be something else).")


def _no_round(number: int, total: int, runs: dict) -> None:
    """The default on_round: say nothing."""


def _no_line(line: str) -> None:
    """The default on_line: say nothing."""


def run_probe(p: dict, client: SGLangClient, on_round: Callable[[int, int, dict], None] = _no_round,
              on_line: Callable[[str], None] = _no_line) -> dict:
    """The whole measurement; returns the result dict (without the gate).

    After each round, on_round(round number, rounds, {"cold": run, "device": run, "host": run}) gets
    that round's runs (the tiers measured), e.g. to write progress while a long probe runs. With
    capacity_max_prefixes, the capacity measurement follows the rounds (sglang_probe_capacity) and
    on_line gets its progress lines."""
    result: dict = {}
    waited = wait_until_healthy(client, p["ready_timeout"])
    server_info = client.get_json(("/get_server_info", "/server_info"))
    model_info = client.get_json(("/get_model_info", "/model_info"))
    facts = extract_server_facts(server_info, model_info)
    vocab, vocab_source = resolve_vocab_size(p.get("vocab_size"), facts)
    facts.pop("vocab_size_reported", None)
    facts["vocab_size"] = vocab
    facts["vocab_size_source"] = vocab_source
    facts["waited_for_health_s"] = round(waited, 3)
    result["server"] = facts
    if facts["page_size"] > p["input_len"]:
        raise ProbeError(f"the server reported page_size {facts['page_size']}, larger than the prompt's input_len "
                         f"{p['input_len']} tokens: no page of the prompt could be cached, and a gate on that "
                         "passes on nothing. Raise input_len or check the server's --page-size.")
    limit = facts.get("max_req_input_len")
    if isinstance(limit, int) and limit > 0 and p["input_len"] > limit:
        raise ProbeError(f"input_len {p['input_len']} exceeds the server's max_req_input_len {limit}; lower "
                         "input_len or raise the server's --context-length.")
    # Issue 25 item 2: the pools the server reports against the plan, before anything is probed.
    result["pools"] = check_pools(client, server_info, facts)
    if result["pools"]["failures"] and p.get("gate", True):
        return result
    # capacity_max_prefixes auto is worked out from the pools now, so a server that reports no host
    # pool fails before the cache is flushed.
    capacity_m = resolve_capacity_prefixes(p, result["pools"], facts)
    tiers = tiers_of(p["tier"])
    backend = facts.get("hicache_storage_backend")
    if "storage" in tiers or p.get("storage_reread_first"):
        result["storage"] = {"backend": backend, "measured": bool(backend and "storage" in tiers), "note": None}
        if not backend:
            result["storage"]["note"] = ("the server runs without a storage backend (no hicache_storage_backend in "
                                         "/get_server_info): the storage tier was not measured")
    if not backend:
        tiers = [t for t in tiers if t != "storage"]
    fillers: list[int] = []
    if "host" in tiers:
        fillers = filler_lengths(facts.get("max_total_num_tokens") or 0, p["input_len"], p["filler_factor"],
                                 limit if isinstance(limit, int) else None)
        result["fillers"] = {"count": len(fillers), "tokens": fillers, "total_tokens": sum(fillers),
                             "device_capacity_tokens": facts.get("max_total_num_tokens")}
        # Issue 25 item 3, with the server's own figures: the host pool must hold the prefix and the
        # fillers that push it out of the device pool, or the host tier cannot be proven (a config that
        # grew the device pool, e.g. --mem-fraction-static, needs a bigger host pool or a shorter probe).
        host_pool = result["pools"].get("host_tokens")
        if isinstance(host_pool, int) and host_pool > 0 and host_pool < p["input_len"] + sum(fillers):
            result["pools"]["probe_failures"] = [
                f"the host pool holds {host_pool} tokens per rank, fewer than the probed prefix ({p['input_len']} "
                f"tokens) plus the fillers that push it out of the device pool ({sum(fillers)} tokens: filler_factor "
                f"{p['filler_factor']:g} x the {facts.get('max_total_num_tokens')} device tokens the server reports): "
                "the host tier cannot be proven. Raise --hicache-size (sglang_service_hicache_args), lower "
                "--mem-fraction-static, or probe a shorter prefix (rollout_probe_input_len, _canary)"
            ]
            if p.get("gate", True):
                return result

    cold_len, warm_len = parity_output_lens(p)
    logprobs = bool(p.get("parity_tokens"))
    # /flush_cache leaves the storage tier (SGLang 0.5.23 flushes GPU and host memory only), so with a
    # storage backend the seeded prompt may come back from storage: each round then reads a prompt of
    # its own (the seed, a nonce of this run and the round), which no earlier run wrote. The seeded
    # prompt itself is what storage_reread_first reads back: it is the same in every run.
    nonce = os.urandom(6).hex() if backend else None
    if nonce:
        result["storage"] = dict(result.get("storage") or {"backend": backend, "measured": False, "note": None},
                                 round_prompts=f"seed {p['seed']}, run nonce {nonce}, round number")

    def bodies(seed: object) -> tuple[bytes, bytes]:
        ids = repeated_block_ids(p["input_len"], vocab, seed, PROMPT_BLOCK_LEN)
        return (generate_body(ids, cold_len, p["temperature"], return_logprob=logprobs),
                generate_body(ids, warm_len, p["temperature"], return_logprob=logprobs))

    cold_body, warm_body = bodies(p["seed"])

    def timed(body: bytes) -> dict:
        try:
            return client.stream_generate(body, input_len=p["input_len"])
        except MissingAccounting:
            raise ProbeError(missing_accounting_message(client, facts)) from None

    if p.get("storage_reread_first") and backend:
        # The seeded prompt the previous run (before a restart) read, sent before any flush: what comes
        # back from storage is what survived the restart.
        result["restart_hit"] = restart_hit(timed(warm_body), p["input_len"])
        on_line("restart re-read: " + restart_line(result["restart_hit"]))
    rounds: list[dict] = []
    cold_runs: list[dict] = []
    warm_runs: dict[str, list[dict]] = {t: [] for t in tiers}
    for i in range(p["repeats"]):
        if nonce:
            cold_body, warm_body = bodies(f"{p['seed']}:{nonce}:round:{i + 1}")
        flush_cache(client, p["flush_timeout"])
        runs = {"cold": timed(cold_body)}
        if "device" in tiers:
            runs["device"] = timed(warm_body)
        if "host" in tiers:
            for j, n in enumerate(fillers):
                body = generate_body(generate_ids(n, vocab, f"{p['seed']}:filler:{j}"), 1, p["temperature"])
                client.stream_generate(body, need_accounting=False)
            runs["host"] = timed(warm_body)
        if "storage" in tiers:
            # Let the write-back of the prefix to the storage tier finish, then clear GPU and host memory:
            # the re-read can only hit storage.
            time.sleep(p.get("storage_write_wait_s") or 0)
            flush_cache(client, p["flush_timeout"])
            runs["storage"] = timed(warm_body)
        cold_runs.append(runs["cold"])
        for tier in tiers:
            warm_runs[tier].append(runs[tier])
        rounds.append(runs)
        on_round(i + 1, p["repeats"], runs)
    result["cold"] = summarize_case(cold_runs, p["input_len"], cold_len)
    result["warm"] = {t: summarize_case(warm_runs[t], p["input_len"], warm_len) for t in tiers}
    result["parity"] = parity_comparisons(rounds, tiers, p)
    add_warm_ratios(result["warm"], result["cold"])
    if capacity_m:
        # After the rounds, which it leaves as they were: the gate reads only cold, warm and parity.
        result["capacity"] = measure_capacity(p, client, facts, vocab, capacity_m, on_line=on_line)
    result["requests_sent"] = client.requests_sent
    return result


def restart_hit(run: dict, input_len: int) -> dict:
    """The figures of the restart re-read (storage_reread_first): cached tokens by tier, TTFT."""
    return {"prompt_tokens": run.get("prompt_tokens") or input_len, "cached_tokens": run["cached_tokens"],
            "device_cached_tokens": run["device_cached_tokens"], "host_cached_tokens": run["host_cached_tokens"],
            "storage_cached_tokens": run.get("storage_cached_tokens") or 0,
            "storage_cached_fraction": _r((run.get("storage_cached_tokens") or 0) / input_len, 4),
            "ttft_ms": _ms(run["ttft_s"])}


def restart_line(hit: dict | None) -> str | None:
    """The restart re-read in a few words (numbers only)."""
    if not isinstance(hit, dict):
        return None
    return (f"{hit['storage_cached_tokens']} of {hit['prompt_tokens']} tokens from storage (cached "
            f"{hit['cached_tokens']}: device {hit['device_cached_tokens']}, host {hit['host_cached_tokens']}), "
            f"TTFT {hit['ttft_ms']:.1f} ms")


LOCK_POLL_S = 1.0


class HostLock:
    """An exclusive lock on a file (none without a path), taken before measuring so that probes
    started together on one host (async, one per instance) measure one after another; waits at most
    `timeout` seconds."""

    def __init__(self, path: str | None, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.timeout = timeout
        self.clock = clock
        self.waited_s = 0.0
        self._fh = None

    def __enter__(self) -> HostLock:
        if not self.path:
            return self
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            raise ProbeError(f"cannot open lock_path {self.path}: {exc.strerror or exc}; choose a writable "
                             "path.") from exc
        start = self.clock()
        for _attempt in range(int(self.timeout / LOCK_POLL_S) + 2):
            try:
                fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if self.clock() - start >= self.timeout:
                    break
                time.sleep(LOCK_POLL_S)
                continue
            self.waited_s = round(self.clock() - start, 3)
            return self
        self._fh.close()
        self._fh = None
        raise ProbeError(f"another probe held lock_path {self.path} for lock_timeout {self.timeout:g} s; wait "
                         "for it to finish or raise lock_timeout.")

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
