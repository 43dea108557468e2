#!/usr/bin/python
# hicache-fleet: cold/warm time-to-first-token probe for an SGLang server with HiCache.
# Runs on the managed host with its system Python: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_cache_probe
short_description: Measure cold and warm time-to-first-token of an SGLang server and gate on it
description:
  - >-
    Measures what the field report's A/B method measures, on a live SGLang server through the native
    C(/generate) API with streaming. A cold request (after C(POST /flush_cache)) of exactly
    O(input_len) seeded random token ids, then warm re-sends of the same ids; says whether the host
    passes.
  - >-
    Each round (medians over O(repeats) rounds) flushes the server cache (retried while the server is
    busy, until O(flush_timeout)) and sends the cold request with O(cold_output_len) output tokens.
    Tier C(device) then re-sends the same ids right away (the prefix is still in GPU memory).
    Tier C(host) first pushes the prefix out of GPU memory with filler requests whose total size is
    O(filler_factor) times the device KV capacity the server reports (C(max_total_num_tokens)), then
    re-sends the ids; the hit must then show under C(meta_info.cached_tokens_details.host), which is
    what proves HiCache's host tier.
  - >-
    TTFT is measured client-side, from just before the request is sent (on an already open
    connection) to the first streamed event that carries output (text or token ids), as SGLang's
    serving benchmark does.
  - >-
    Before measuring, the module waits until the server is healthy (C(/health_generate)) and reads
    C(/get_server_info) and C(/get_model_info) (version, page size, device capacity, HiCache and
    cache-report settings).
  - >-
    It flushes the server cache, so it reports C(changed=true); use C(changed_when: false) in a
    playbook that treats the probe as read-only. In check mode it returns the plan and sends no
    request at all.
version_added: "0.1.0"
author: hicache-fleet
options:
  url:
    description: Base URL of the SGLang server (a path prefix is kept, for servers behind a proxy).
    type: str
    default: http://127.0.0.1:30000
  api_key:
    description: Sent as C(Authorization) C(Bearer) header when the server runs with C(--api-key).
    type: str
  input_len:
    description: Exact number of prompt token ids per request (the seed used 128K).
    type: int
    default: 128000
  cold_output_len:
    description: Output tokens of the cold request (C(ignore_eos) is set so the length is exact).
    type: int
    default: 512
  warm_output_len:
    description: Output tokens of each warm request.
    type: int
    default: 16
  seed:
    description: Seed of the random token ids; cold and warm requests use the same ids.
    type: int
    default: 42
  repeats:
    description: Number of cold/warm rounds; every figure the gate reads is a median over them.
    type: int
    default: 3
  temperature:
    description: Sampling temperature of every request.
    type: float
    default: 0.0
  tier:
    description:
      - C(device) re-sends the prefix right away (GPU radix cache hit).
      - C(host) evicts the prefix from the GPU with filler requests first (HiCache host tier hit).
      - C(both) measures both, device first.
    type: str
    choices: [device, host, both]
    default: both
  vocab_size:
    description:
      - Token ids are drawn from [0, vocab_size).
      - >-
        When unset, taken from the server's model info if it reports one, else from C(config.json)
        in the model directory (read on the managed host), else 32000, valid for nearly every model.
    type: int
  filler_factor:
    description: Total filler tokens for tier C(host), as a multiple of the reported device KV capacity.
    type: float
    default: 1.0
  ready_timeout:
    description: Seconds to wait for the server to answer C(/health_generate) with 200.
    type: float
    default: 900
  flush_timeout:
    description: Seconds to keep retrying C(POST /flush_cache) while the server refuses (busy).
    type: float
    default: 120
  request_timeout:
    description:
      - Seconds one generate request may take.
      - >-
        A cold 128K prefill takes about 192 s on two Radeon 7900 XTX, so the default leaves a wide
        margin.
    type: float
    default: 900
  max_warm_ttft_s:
    description:
      - Gate, per warm tier, on the median warm TTFT in seconds (the seed measured 2.65 s).
      - Unset means not checked.
    type: float
  max_warm_cold_ratio:
    description: Gate, per warm tier, on median warm TTFT / median cold TTFT (the seed measured 0.014).
    type: float
    default: 0.2
  min_cached_fraction:
    description:
      - Gate, per warm tier, on the median cached tokens of a warm request.
      - >-
        Required tokens are fraction x input_len rounded down to whole pages, and at most what a
        server can cache (input_len - 1 rounded down to pages, as the last prompt token is always
        recomputed).
    type: float
    default: 0.9
  min_host_cached_fraction:
    description: Gate for tier C(host), the same rule applied to C(cached_tokens_details.host).
    type: float
    default: 0.8
  baseline:
    description:
      - >-
        An earlier result to hold the host to: the registered result of an earlier run of this
        module, the JSON it wrote to O(report_path) (as a dict), or the path of that JSON file on the
        managed host. Any dict with C(cold.median_ttft_ms) (and optionally C(warm.<tier>.median_ttft_ms)
        and C(input_len)) does, e.g. a median of other hosts' results.
      - >-
        A C(source) key in the dict names it in the gate's reasons (e.g. C(the last validated result on
        this host)).
      - >-
        Each median TTFT (cold, and each warm tier the baseline has) may be at most
        baseline x (1 + O(max_regression)) + O(regression_slack_ms).
      - >-
        Prompt lengths: a baseline measured with the same O(input_len) is compared figure by figure. A
        baseline measured with a longer prompt has its cold TTFT scaled down linearly to O(input_len)
        (the prefill cost per token grows with the prompt, so where prefill dominates the TTFT this
        overstates what a healthy server takes, never understates it) and its warm figures are not
        compared (a warm hit's time is not proportional to the prompt). A baseline measured with a
        shorter prompt is not compared at all (scaling it up would understate the expected time).
        C(gate.baseline) says what was compared.
    type: raw
  max_regression:
    description:
      - Allowed relative TTFT regression against O(baseline) (0.25 means 25% slower, 1.0 twice as slow).
    type: float
    default: 0.25
  regression_slack_ms:
    description:
      - >-
        Milliseconds added to every O(baseline) limit: differences this small are measurement noise
        (HTTP, scheduling), not a regression. Matters for warm reads that take milliseconds.
    type: float
    default: 0.0
  gate:
    description: When false, only measure; the checks are still reported but never fail the task.
    type: bool
    default: true
  report_path:
    description:
      - Write a JSON record to this path on the managed host, also when the gate fails.
      - >-
        Its key names follow SGLang's serving benchmark (C(median_ttft_ms), C(input_throughput),
        C(cache_report) with C(total_prompt_tokens), C(total_cached_tokens), C(cache_hit_rate_pct),
        C(device_cached_tokens), C(host_cached_tokens)).
    type: path
notes:
  - Needs only the Python standard library on the managed host.
  - >-
    The server must report cached tokens in C(meta_info) of C(/generate) (SGLang does; start it with
    C(--enable-cache-report) so the OpenAI endpoints report them too).
  - Sends one request at a time, only to the server named in O(url).
"""

EXAMPLES = r"""
- name: Probe cold/warm TTFT of the local server and gate the rollout on it
  sglang_cache_probe:
    url: "http://127.0.0.1:{{ sglang_service_port }}"
    api_key: "{{ sglang_service_api_key | default(omit) }}"
    tier: both
    max_warm_cold_ratio: 0.05
    min_host_cached_fraction: 0.9
    report_path: /var/lib/hicache-fleet/probe.json
  register: probe
  changed_when: false

- name: Measure only (no gate), 32K prompt, one round
  sglang_cache_probe:
    input_len: 32768
    repeats: 1
    tier: device
    gate: false
  register: measured

- name: Hold the host to its own validated result (at most twice as slow, 250 ms of noise allowed)
  sglang_cache_probe:
    baseline: /var/lib/hicache-fleet/probe.json
    max_regression: 1.0
    regression_slack_ms: 250
  changed_when: false
"""

RETURN = r"""
msg:
  description: One-line summary (median cold and warm TTFT per tier, gate verdict).
  returned: always
  type: str
plan:
  description: What the probe does, or in check mode would do (no request is sent in check mode).
  returned: always
  type: dict
  sample:
    tier: both
    steps: ["wait up to 900 s for GET /health_generate to answer 200", "round 1: POST /flush_cache"]
requests_sent:
  description: HTTP requests sent to the server (0 in check mode).
  returned: always
  type: int
server:
  description: What the server reports about itself.
  returned: success or gate failure
  type: dict
  contains:
    version: {description: SGLang version, type: str}
    model_path: {description: model path the server loaded, type: str}
    page_size: {description: KV page size in tokens, type: int}
    max_total_num_tokens: {description: device (GPU) KV capacity in tokens, type: int}
    vocab_size: {description: vocabulary size the ids were drawn from, type: int}
    vocab_size_source: {description: where vocab_size came from, type: str}
    enable_hierarchical_cache: {description: HiCache on, type: bool}
    enable_cache_report: {description: cache report on, type: bool}
    hicache_args: {description: every hicache_* server argument, type: dict}
cold:
  description: The cold case; key names follow SGLang's serving benchmark.
  returned: success or gate failure
  type: dict
  contains:
    completed: {description: number of runs, type: int}
    median_ttft_ms: {description: median TTFT, type: float}
    mean_ttft_ms: {description: mean TTFT, type: float}
    ttfts_ms: {description: TTFT of each run, type: list}
    median_e2e_latency_ms: {description: median end-to-end latency, type: float}
    e2e_latencies_ms: {description: E2E of each run, type: list}
    input_throughput:
      description: Median of prompt tokens / E2E in tok/s, as the benchmark counts it.
      type: float
    median_tpot_ms: {description: median time per output token after the first, type: float}
    median_cached_tokens: {description: median cached tokens, type: int}
    median_device_cached_tokens: {description: median device-cached tokens, type: int}
    median_host_cached_tokens: {description: median host-cached tokens, type: int}
    cached_fraction: {description: median cached tokens / input_len, type: float}
    host_cached_fraction: {description: median host-cached tokens / input_len, type: float}
    cache_report:
      description: >-
        Totals over the runs, as the benchmark's cache report (total_prompt_tokens,
        total_cached_tokens, cache_hit_rate_pct, device_cached_tokens, host_cached_tokens,
        storage_cached_tokens).
      type: dict
    runs: {description: per-run figures, type: list}
warm:
  description: >-
    One case per measured tier (device, host) with the same keys as cold, plus warm_cold_ratio
    (median warm TTFT / median cold TTFT) and speedup (its inverse).
  returned: success or gate failure
  type: dict
fillers:
  description: Filler requests sent per round for tier host (count, tokens of each, total tokens).
  returned: when tier is host or both
  type: dict
gate:
  description: The verdict.
  returned: success or gate failure
  type: dict
  contains:
    enabled: {description: false when gate=false (measure only), type: bool}
    passed: {description: every check passed, type: bool}
    reasons: {description: one sentence per violated threshold with its figure, type: list}
    checks: {description: every check with its value and limit, type: list}
    baseline:
      description: >-
        With O(baseline): its source, its input_len, the scale applied to its cold TTFT, the
        figures compared (ms, at this run's input_len) and a note on what could not be compared.
      type: dict
report_path:
  description: Where the JSON record was written.
  returned: when report_path is set
  type: str
"""

import array
import datetime
import http.client
import json
import math
import os
import random
import socket
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

try:  # Ansible is absent when pytest imports this file to test its functions.
    from ansible.module_utils.basic import AnsibleModule
except ImportError:  # pragma: no cover - exercised only without ansible installed
    AnsibleModule = None  # type: ignore[assignment,misc]

DEFAULT_VOCAB_SIZE = 32000
DONE = "[DONE]"
TIERS = ("device", "host")
POLL_INTERVAL_S = 0.5
CONTROL_TIMEOUT_S = 60.0
MAX_FILLERS = 512
BODY_EXCERPT = 300


class ProbeError(Exception):
    """A failure with a sentence a person can act on."""


class ConnectError(ProbeError):
    """The server could not be reached at all."""


class MissingAccounting(ProbeError):
    """A /generate response without meta_info.cached_tokens."""


class HttpStatusError(ProbeError):
    def __init__(self, message: str, status: int, body: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


# ---------------------------------------------------------------------------------------------------
# Plain functions (unit-tested without Ansible)
# ---------------------------------------------------------------------------------------------------


def generate_ids(n: int, vocab_size: int, seed: Any) -> list[int]:
    """Exactly n seeded random token ids in [0, vocab_size). 128K ids cost a few milliseconds."""
    if n < 0 or vocab_size < 1:
        raise ValueError("n must be >= 0 and vocab_size >= 1")
    rng = random.Random(seed)
    words = array.array("I")
    if words.itemsize != 4:  # pragma: no cover - every mainstream platform has 4-byte unsigned int
        return rng.choices(range(vocab_size), k=n)
    words.frombytes(rng.randbytes(4 * n))
    if sys.byteorder == "big":  # pragma: no cover - same ids on big-endian hosts
        words.byteswap()
    return [w % vocab_size for w in words]


def generate_body(ids: list[int], max_new_tokens: int, temperature: float) -> bytes:
    """The native /generate request, streamed, with an exact output length."""
    payload = {
        "input_ids": ids,
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "ignore_eos": True,
        },
        "stream": True,
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def parse_sse_line(line: bytes) -> Any:
    """One line of an SSE stream: None (blank, comment, other field), DONE, or the decoded event."""
    line = line.strip()
    if not line or line.startswith(b":"):
        return None
    if line.startswith(b"data:"):
        data = line[5:].strip()
    elif line.startswith(b"{"):
        data = line  # a server that answers one JSON object instead of SSE
    else:
        return None
    if data == b"[DONE]":
        return DONE
    try:
        event = json.loads(data)
    except ValueError as exc:
        raise ProbeError(
            "the /generate stream carried an event that is not JSON "
            f"({data[:80]!r}); is the endpoint an SGLang server?"
        ) from exc
    if not isinstance(event, dict):
        raise ProbeError(
            f"the /generate stream carried a non-object event ({data[:80]!r}); is the endpoint an "
            "SGLang server?"
        )
    return event


def event_has_output(event: dict) -> bool:
    """True when a streamed event carries generated output (text or token ids)."""
    if event.get("text"):
        return True
    if event.get("output_ids"):
        return True
    meta = event.get("meta_info")
    return isinstance(meta, dict) and bool(meta.get("completion_tokens"))


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def round_down_to_page(tokens: float, page_size: int) -> int:
    page = max(int(page_size or 1), 1)
    return math.floor(tokens / page) * page


def required_cached_tokens(fraction: float, input_len: int, page_size: int) -> int:
    """Cached tokens a warm hit must show: fraction x input_len rounded down to whole pages, capped
    at what a server can cache at all (the last prompt token is always recomputed)."""
    wanted = round_down_to_page(fraction * input_len, page_size)
    cacheable = round_down_to_page(max(input_len - 1, 0), page_size)
    return max(min(wanted, cacheable), 0)


def validate_params(p: dict) -> list[str]:
    """Every option combination that makes no sense, one sentence each."""
    errors = []
    for name in ("input_len", "cold_output_len", "warm_output_len", "repeats"):
        if p.get(name) is not None and p[name] < 1:
            errors.append(f"{name} must be at least 1 (got {p[name]}).")
    for name in ("ready_timeout", "flush_timeout", "request_timeout", "filler_factor"):
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
    for name in ("min_cached_fraction", "min_host_cached_fraction"):
        value = p.get(name)
        if value is not None and not 0 <= value <= 1:
            errors.append(
                f"{name} must be between 0 and 1 (got {value}); it is a fraction of input_len."
            )
    if p.get("max_regression") is not None and p["max_regression"] < 0:
        errors.append(f"max_regression must be >= 0 (got {p['max_regression']}).")
    if p.get("regression_slack_ms") is not None and p["regression_slack_ms"] < 0:
        errors.append(f"regression_slack_ms must be >= 0 (got {p['regression_slack_ms']}).")
    return errors


def tiers_of(tier: str) -> list[str]:
    return list(TIERS) if tier == "both" else [tier]


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
        f"cold: POST /generate {p['input_len']} ids (seed {p['seed']}) -> {p['cold_output_len']} tokens",
    ]
    tiers = tiers_of(p["tier"])
    if "device" in tiers:
        rnd.append(f"warm device: the same {p['input_len']} ids -> {p['warm_output_len']} tokens")
    if "host" in tiers:
        rnd.append(
            f"fillers: {p['filler_factor']:g} x the device KV capacity (max_total_num_tokens) in "
            "requests of other random ids -> 1 token each"
        )
        rnd.append(f"warm host: the same {p['input_len']} ids -> {p['warm_output_len']} tokens")
    for i in range(p["repeats"]):
        steps.extend(f"round {i + 1}: {s}" for s in rnd)
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
    page_size = server_info.get("page_size")
    return {
        "version": server_info.get("version"),
        "model_path": model_info.get("model_path") or server_info.get("model_path"),
        "served_model_name": model_info.get("served_model_name")
        or server_info.get("served_model_name"),
        "page_size": int(page_size) if isinstance(page_size, int) and page_size > 0 else 1,
        "max_total_num_tokens": int(capacity) if isinstance(capacity, (int, float)) else None,
        "max_req_input_len": server_info.get("max_req_input_len"),
        "context_length": server_info.get("context_length"),
        "enable_hierarchical_cache": bool(server_info.get("enable_hierarchical_cache")),
        "enable_cache_report": server_info.get("enable_cache_report"),
        "hicache_args": hicache_args,
        "vocab_size_reported": model_info.get("vocab_size") or server_info.get("vocab_size"),
    }


def vocab_from_config(model_path: str | None) -> int | None:
    """vocab_size from the model directory's config.json on this host, if it is readable."""
    if not model_path or not os.path.isdir(model_path):
        return None
    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
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


def cached_split(meta: dict) -> dict:
    """cached/device/host/storage tokens of one response's meta_info."""
    cached = int(meta.get("cached_tokens") or 0)
    details = meta.get("cached_tokens_details")
    if isinstance(details, dict):
        device = int(details.get("device") or 0)
        host = int(details.get("host") or 0)
        storage = int(details.get("storage") or 0)
    else:  # SGLang reports no details when nothing was cached, and device-only without HiCache
        device, host, storage = cached, 0, 0
    return {"cached_tokens": cached, "device": device, "host": host, "storage": storage}


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
    devices = [r["device_cached_tokens"] for r in runs]
    storage = sum(r.get("storage_cached_tokens") or 0 for r in runs)
    total_prompt = sum(prompts)
    total_cached = sum(cached)
    med_cached = median(cached)
    med_host = median(hosts)
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
        "cached_fraction": None if med_cached is None else _r(med_cached / input_len, 4),
        "host_cached_fraction": None if med_host is None else _r(med_host / input_len, 4),
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
                with open(os.path.expanduser(baseline), encoding="utf-8") as fh:
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

    reasons = [c["reason"] for c in checks if not c["passed"]]
    gate = {"enabled": bool(p.get("gate", True)), "passed": not reasons, "reasons": reasons, "checks": checks}
    if compared is not None:
        gate["baseline"] = compared
    return gate


def build_report(result: dict, p: dict) -> dict:
    """The JSON record written to report_path, in SGLang benchmark key names."""
    settings = {k: p.get(k) for k in (
        "url", "input_len", "cold_output_len", "warm_output_len", "seed", "repeats", "temperature",
        "tier", "filler_factor", "max_warm_ttft_s", "max_warm_cold_ratio", "min_cached_fraction",
        "min_host_cached_fraction", "max_regression", "regression_slack_ms", "gate")}
    return {
        "tool": "sglang_cache_probe",
        "backend": "sglang",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "dataset_name": "random-ids",
        "random_input_len": p["input_len"],
        "seed": p["seed"],
        "max_concurrency": 1,
        "settings": settings,
        "server_info": result.get("server"),
        "cold": result.get("cold"),
        "warm": result.get("warm"),
        "fillers": result.get("fillers"),
        "gate": result.get("gate"),
    }


def summary_line(result: dict) -> str:
    parts = []
    cold = result.get("cold") or {}
    if cold.get("median_ttft_ms") is not None:
        parts.append(f"cold TTFT {cold['median_ttft_ms']:.1f} ms")
    for tier, case in (result.get("warm") or {}).items():
        if case.get("median_ttft_ms") is not None:
            parts.append(f"warm {tier} TTFT {case['median_ttft_ms']:.1f} ms "
                         f"(ratio {case.get('warm_cold_ratio')}, cached {case.get('median_cached_tokens')}, "
                         f"host {case.get('median_host_cached_tokens')})")
    gate = result.get("gate") or {}
    if gate:
        verdict = "passed" if gate.get("passed") else "FAILED: " + "; ".join(gate.get("reasons", []))
        parts.append(("gate " if gate.get("enabled") else "checks (gate off) ") + verdict)
    return "; ".join(parts)


def write_report(path: str, report: dict) -> None:
    try:
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, sort_keys=False)
            fh.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise ProbeError(f"cannot write report_path {path}: {exc.strerror or exc}; choose a writable path.") from exc


# ---------------------------------------------------------------------------------------------------
# HTTP client (http.client, SSE by hand)
# ---------------------------------------------------------------------------------------------------


def _excerpt(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:BODY_EXCERPT] + ("…" if len(text) > BODY_EXCERPT else "")


def _drain(resp: http.client.HTTPResponse, conn: http.client.HTTPConnection) -> None:
    """Read what follows [DONE] (the end of the chunked body), briefly, so closing the connection
    does not reset it under the server's feet."""
    try:
        if conn.sock is not None:
            conn.sock.settimeout(1.0)
        resp.read(64 * 1024)
    except (OSError, http.client.HTTPException):
        pass


class SGLangClient:
    def __init__(self, url: str, api_key: str | None = None, request_timeout: float = 900.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ProbeError(f"url {url!r} is not an http:// or https:// URL with a host.")
        self.url = url.rstrip("/")
        self.scheme = parts.scheme
        self.host = parts.hostname
        try:
            self.port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ProbeError(f"url {url!r} has an invalid port.") from exc
        self.prefix = parts.path.rstrip("/")
        self.api_key = api_key
        self.request_timeout = request_timeout
        self.requests_sent = 0

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _headers(self, body: bool) -> dict:
        headers = {"Accept": "*/*", "User-Agent": "hicache-fleet-sglang-cache-probe"}
        if body:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _status_error(self, method: str, path: str, status: int, reason: str, body: bytes) -> HttpStatusError:
        excerpt = _excerpt(body)
        where = f"{method} {self.url}{path}"
        if status in (401, 403):
            if self.api_key:
                msg = (f"{where} answered HTTP {status} ({excerpt or reason}): the server rejected the api_key; "
                       "set api_key to the server's --api-key (flush_cache may need --admin-api-key).")
            else:
                msg = (f"{where} answered HTTP {status} ({excerpt or reason}): the server requires an API key; "
                       "set the module's api_key option to its --api-key.")
        else:
            msg = f"{where} answered HTTP {status} {reason}: {excerpt or '(empty body)'}"
        return HttpStatusError(msg, status, excerpt)

    def _network_error(self, method: str, path: str, exc: BaseException, timeout: float) -> ProbeError:
        where = f"{method} {self.url}{path}"
        if isinstance(exc, ConnectionRefusedError):
            return ConnectError(f"cannot connect to {self.url} (connection refused): is the SGLang server "
                                "running and listening on that host and port?")
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return ProbeError(f"{where}: no answer within {timeout:g} s; raise request_timeout or check the server.")
        if isinstance(exc, socket.gaierror):
            return ConnectError(f"cannot resolve the host of {self.url} ({exc}); check url.")
        return ConnectError(f"{where} failed: {type(exc).__name__}: {exc}")

    def request(self, method: str, path: str, body: bytes | None = None,
                timeout: float | None = None) -> tuple[int, bytes]:
        """One plain request; returns (status, body). Raises ConnectError/ProbeError on network faults."""
        timeout = timeout or min(self.request_timeout, CONTROL_TIMEOUT_S)
        conn = self._connection(timeout)
        try:
            self.requests_sent += 1
            conn.request(method, self.prefix + path, body=body, headers=self._headers(body is not None))
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, data
        except (OSError, http.client.HTTPException) as exc:
            raise self._network_error(method, path, exc, timeout) from exc
        finally:
            conn.close()

    def get_json(self, paths: tuple[str, ...]) -> dict:
        """GET the first of paths that exists (SGLang renamed some endpoints); {} if none does."""
        for path in paths:
            status, data = self.request("GET", path)
            if status == 404:
                continue
            if status != 200:
                raise self._status_error("GET", path, status, "", data)
            try:
                value = json.loads(data)
            except ValueError as exc:
                raise ProbeError(f"GET {self.url}{path} did not return JSON ({_excerpt(data)[:80]}); is the "
                                 "endpoint an SGLang server?") from exc
            return value if isinstance(value, dict) else {}
        return {}

    def stream_generate(self, body: bytes, need_accounting: bool = True,
                        on_cut_hint: str = "") -> dict:
        """POST /generate with stream=true; TTFT from just before sending to the first output event."""
        path = "/generate"
        timeout = self.request_timeout
        conn = self._connection(timeout)
        headers = self._headers(True)
        ttft = None
        events = 0
        last_meta: dict | None = None
        done = False
        cut: str | None = None
        t_last = None
        try:
            self.requests_sent += 1
            try:
                conn.connect()  # before the clock: TCP setup is not the server's time to first token
            except OSError as exc:
                raise self._network_error("POST", path, exc, timeout) from exc
            t0 = time.perf_counter()
            try:
                conn.request("POST", self.prefix + path, body=body, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise self._network_error("POST", path, exc, timeout) from exc
            if resp.status != 200:
                try:
                    data = resp.read(64 * 1024)
                except (OSError, http.client.HTTPException):
                    data = b""
                raise self._status_error("POST", path, resp.status, resp.reason, data)
            deadline = t0 + timeout
            while True:
                try:
                    line = resp.readline()
                except TimeoutError as exc:
                    raise self._network_error("POST", path, exc, timeout) from exc
                except (OSError, http.client.HTTPException) as exc:
                    cut = f"{type(exc).__name__}: {exc}"
                    break
                now = time.perf_counter()
                if not line:
                    break
                if now > deadline:
                    raise ProbeError(f"POST {self.url}{path} streamed for more than request_timeout "
                                     f"{timeout:g} s; raise request_timeout.")
                event = parse_sse_line(line)
                if event is None:
                    continue
                t_last = now
                if event == DONE:
                    done = True
                    _drain(resp, conn)
                    break
                events += 1
                if "error" in event and not event_has_output(event):
                    raise ProbeError(f"POST {self.url}{path} reported an error mid-stream: "
                                     f"{_excerpt(json.dumps(event['error']).encode())}")
                meta = event.get("meta_info")
                if isinstance(meta, dict):
                    last_meta = meta
                if ttft is None and event_has_output(event):
                    ttft = now - t0
        finally:
            conn.close()
        finished = done or bool(last_meta and last_meta.get("finish_reason") is not None)
        if not finished:
            got = (last_meta or {}).get("completion_tokens")
            raise ProbeError(
                f"the stream of POST {self.url}{path} was cut after {events} events"
                f"{f' and {got} output tokens' if got is not None else ''} without a finish_reason or "
                f"[DONE]{f' ({cut})' if cut else ''}: the server closed the connection mid-way (crash, "
                f"restart, out of memory or a proxy timeout); check the server log."
            )
        if ttft is None:
            raise ProbeError(f"POST {self.url}{path} finished without streaming any output token; is the "
                             "endpoint an SGLang server serving a generation model?")
        meta = last_meta or {}
        if need_accounting and "cached_tokens" not in meta:
            raise MissingAccounting("the response carries no meta_info.cached_tokens")
        split = cached_split(meta)
        return {
            "ttft_s": ttft,
            "e2e_s": (t_last or t0) - t0,
            "events": events,
            "prompt_tokens": meta.get("prompt_tokens"),
            "completion_tokens": meta.get("completion_tokens"),
            "finish_reason": meta.get("finish_reason"),
            "cached_tokens": split["cached_tokens"],
            "device_cached_tokens": split["device"],
            "host_cached_tokens": split["host"],
            "storage_cached_tokens": split["storage"],
            "meta_info": meta,
        }


# ---------------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------------


def wait_until_healthy(client: SGLangClient, ready_timeout: float,
                       clock: Callable[[], float] = time.monotonic) -> float:
    """Poll /health_generate (or /health) until 200; returns the seconds waited."""
    start = clock()
    deadline = start + ready_timeout
    last = "no answer"
    path = "/health_generate"
    attempts = 0
    refused = False
    max_attempts = int(ready_timeout / POLL_INTERVAL_S) + 3
    while attempts < max_attempts:
        attempts += 1
        remaining = deadline - clock()
        try:
            status, data = client.request("GET", path, timeout=max(min(remaining, CONTROL_TIMEOUT_S), 1.0))
        except ConnectError as exc:
            last = str(exc)
            refused = True
        except ProbeError as exc:
            last = str(exc)
            refused = False
        else:
            refused = False
            if status == 200:
                return clock() - start
            if status == 404 and path == "/health_generate":
                path = "/health"
                continue
            if status in (401, 403):
                raise client._status_error("GET", path, status, "", data)
            last = f"GET {client.url}{path} answered HTTP {status}" + (f" ({_excerpt(data)})" if data else "")
        remaining = deadline - clock()
        if remaining <= 0:
            break
        time.sleep(min(POLL_INTERVAL_S, remaining))
    if refused:
        raise ConnectError(f"{last} (kept trying for ready_timeout {ready_timeout:g} s)")
    raise ProbeError(f"the server at {client.url} did not become healthy within ready_timeout "
                     f"{ready_timeout:g} s; last answer: {last}. Is the model still loading (raise "
                     "ready_timeout) or did it fail to start (check its log)?")


def flush_cache(client: SGLangClient, flush_timeout: float,
                clock: Callable[[], float] = time.monotonic) -> int:
    """POST /flush_cache, retried while the server refuses (busy); returns the attempts made."""
    deadline = clock() + flush_timeout
    attempts = 0
    max_attempts = int(flush_timeout / POLL_INTERVAL_S) + 3
    last = ""
    while attempts < max_attempts:
        attempts += 1
        status, data = client.request("POST", "/flush_cache", body=b"")
        if status == 200:
            return attempts
        if status in (401, 403, 404) or status >= 500:
            raise client._status_error("POST", "/flush_cache", status, "", data)
        last = f"HTTP {status} {_excerpt(data)}"
        remaining = deadline - clock()
        if remaining <= 0:
            break
        time.sleep(min(POLL_INTERVAL_S, remaining))
    raise ProbeError(f"POST {client.url}/flush_cache was refused for flush_timeout {flush_timeout:g} s "
                     f"({attempts} attempts, last: {last}); the server stays busy with other requests: "
                     "stop the traffic to this host (drain it) or raise flush_timeout.")


def missing_accounting_message(client: SGLangClient, facts: dict) -> str:
    flag = facts.get("enable_cache_report")
    state = ("its /get_server_info says enable_cache_report is false" if flag is False
             else "it does not report enable_cache_report" if flag is None
             else "although it reports enable_cache_report true")
    return (f"the /generate response of {client.url} carries no meta_info.cached_tokens, so cache hits "
            f"cannot be verified ({state}): start the server with --enable-cache-report, or point url at "
            "an SGLang server (the endpoint may be something else).")


def run_probe(p: dict, client: SGLangClient, log: Callable[[str], None] = lambda s: None) -> dict:
    """The whole measurement; returns the result dict (without the gate)."""
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
    limit = facts.get("max_req_input_len")
    if isinstance(limit, int) and limit > 0 and p["input_len"] > limit:
        raise ProbeError(f"input_len {p['input_len']} exceeds the server's max_req_input_len {limit}; lower "
                         "input_len or raise the server's --context-length.")
    tiers = tiers_of(p["tier"])
    fillers: list[int] = []
    if "host" in tiers:
        fillers = filler_lengths(facts.get("max_total_num_tokens") or 0, p["input_len"], p["filler_factor"],
                                 limit if isinstance(limit, int) else None)
        result["fillers"] = {"count": len(fillers), "tokens": fillers, "total_tokens": sum(fillers),
                             "device_capacity_tokens": facts.get("max_total_num_tokens")}

    ids = generate_ids(p["input_len"], vocab, p["seed"])
    cold_body = generate_body(ids, p["cold_output_len"], p["temperature"])
    warm_body = generate_body(ids, p["warm_output_len"], p["temperature"])
    del ids

    def timed(body: bytes) -> dict:
        try:
            return client.stream_generate(body)
        except MissingAccounting:
            raise ProbeError(missing_accounting_message(client, facts)) from None

    cold_runs: list[dict] = []
    warm_runs: dict[str, list[dict]] = {t: [] for t in tiers}
    for i in range(p["repeats"]):
        log(f"round {i + 1}: flush")
        flush_cache(client, p["flush_timeout"])
        cold_runs.append(timed(cold_body))
        if "device" in tiers:
            warm_runs["device"].append(timed(warm_body))
        if "host" in tiers:
            for j, n in enumerate(fillers):
                body = generate_body(generate_ids(n, vocab, f"{p['seed']}:filler:{j}"), 1, p["temperature"])
                client.stream_generate(body, need_accounting=False)
            warm_runs["host"].append(timed(warm_body))
    result["cold"] = summarize_case(cold_runs, p["input_len"], p["cold_output_len"])
    result["warm"] = {t: summarize_case(warm_runs[t], p["input_len"], p["warm_output_len"]) for t in tiers}
    add_warm_ratios(result["warm"], result["cold"])
    result["requests_sent"] = client.requests_sent
    return result


ARGUMENT_SPEC = {
    "url": {"type": "str", "default": "http://127.0.0.1:30000"},
    "api_key": {"type": "str", "no_log": True},
    "input_len": {"type": "int", "default": 128000},
    "cold_output_len": {"type": "int", "default": 512},
    "warm_output_len": {"type": "int", "default": 16},
    "seed": {"type": "int", "default": 42},
    "repeats": {"type": "int", "default": 3},
    "temperature": {"type": "float", "default": 0.0},
    "tier": {"type": "str", "default": "both", "choices": ["device", "host", "both"]},
    "vocab_size": {"type": "int"},
    "filler_factor": {"type": "float", "default": 1.0},
    "ready_timeout": {"type": "float", "default": 900.0},
    "flush_timeout": {"type": "float", "default": 120.0},
    "request_timeout": {"type": "float", "default": 900.0},
    "max_warm_ttft_s": {"type": "float"},
    "max_warm_cold_ratio": {"type": "float", "default": 0.2},
    "min_cached_fraction": {"type": "float", "default": 0.9},
    "min_host_cached_fraction": {"type": "float", "default": 0.8},
    "baseline": {"type": "raw"},
    "max_regression": {"type": "float", "default": 0.25},
    "regression_slack_ms": {"type": "float", "default": 0.0},
    "gate": {"type": "bool", "default": True},
    "report_path": {"type": "path"},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = dict(module.params)
    errors = validate_params(p)
    if errors:
        module.fail_json(msg="invalid options: " + " ".join(errors))
    plan = {"url": p["url"], "tier": p["tier"], "tiers": tiers_of(p["tier"]), "repeats": p["repeats"],
            "input_len": p["input_len"], "steps": plan_steps(p)}
    try:
        baseline = load_baseline(p.get("baseline"))
        client = SGLangClient(p["url"], p.get("api_key"), p["request_timeout"])
    except ProbeError as exc:
        module.fail_json(msg=str(exc), plan=plan)
    if module.check_mode:
        module.exit_json(changed=True, plan=plan, requests_sent=0,
                         msg=f"check mode: would probe {p['url']} ({len(plan['steps'])} steps); nothing sent")
    result: dict = {"plan": plan}
    try:
        result.update(run_probe(p, client))
        result["gate"] = evaluate_gate(result, p, baseline)
        if p.get("report_path"):
            write_report(p["report_path"], build_report(result, p))
            result["report_path"] = p["report_path"]
    except ProbeError as exc:
        module.fail_json(msg=str(exc), changed=client.requests_sent > 0, **result)
    except Exception as exc:
        module.fail_json(msg=f"unexpected {type(exc).__name__} while probing {p['url']}: {exc}",
                         changed=client.requests_sent > 0, **result)
    result["msg"] = summary_line(result)
    if p["gate"] and not result["gate"]["passed"]:
        result["msg"] = (f"the probe gate failed on {p['url']}: " + "; ".join(result["gate"]["reasons"]))
        module.fail_json(changed=True, **result)
    module.exit_json(changed=True, **result)


if __name__ == "__main__":
    main()
