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
    O(input_len) seeded random token ids (a random block repeated), then warm re-sends of the same
    ids; says whether the host passes: fast warm reads, the tokens reported as cached, and the same
    greedy answer as the cold read (O(parity_tokens)).
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
    It flushes the server cache and fills it again with its own prompts; that is not a change the
    operator has to act on, so C(changed) is true only when the module wrote O(report_path) on the
    managed host. In check mode it returns the plan and sends no request at all.
  - >-
    With O(capacity_max_prefixes) it then measures how many distinct prefixes of O(input_len) tokens
    the cache holds (filled, then re-read newest first); the gate does not read that figure.
  - >-
    With O(progress_path) it writes one line per round (cold and warm TTFT, cached tokens), and one per
    capacity prefix with O(capacity_max_prefixes), to that file while it runs, so a playbook that runs it
    with C(async) can print each round as it comes.
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
options:
  url:
    description: Base URL of the SGLang server (a path prefix is kept, for servers behind a proxy).
    type: str
    default: http://127.0.0.1:30000
  api_key:
    description: Sent as C(Authorization) C(Bearer) header when the server runs with C(--api-key).
    type: str
  admin_api_key:
    description:
      - The server's C(--admin-api-key). SGLang then takes only this key on its admin endpoints, of
        which the probe uses C(/flush_cache); every other request still carries O(api_key).
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
    description:
      - Seed of the random token ids; cold and warm requests use the same ids.
      - The prompt is a random block of 256 ids repeated to O(input_len) (see O(parity_tokens)).
    type: int
    default: 42
  repeats:
    description: Number of cold/warm rounds; every figure the gate reads is a median over them.
    type: int
    default: 3
  temperature:
    description: Sampling temperature of every request; must be 0 while O(parity_tokens) is not 0.
    type: float
    default: 0.0
  tier:
    description:
      - C(device) re-sends the prefix right away (GPU radix cache hit).
      - C(host) evicts the prefix from the GPU with filler requests first (HiCache host tier hit).
      - C(both) measures both, device first.
      - >-
        C(storage) (issue 27): after the other reads of the round, waits O(storage_write_wait_s), sends
        C(POST /flush_cache) (SGLang 0.5.23 clears GPU and host memory, not the storage tier) and re-sends
        the prefix; the hit must show under C(meta_info.cached_tokens_details.storage). Measured only when
        the server runs with a storage backend (C(hicache_storage_backend) in C(/get_server_info)); tier
        C(storage) alone on a server without one fails the gate.
      - C(all) measures device, host and storage (storage only when the server has a storage backend).
      - >-
        With a storage backend, each round reads a prompt of its own (the seed, a nonce of this run and
        the round number): C(/flush_cache) leaves the storage tier, so the seeded prompt of an earlier run
        would come back from it and no read would be cold.
    type: str
    choices: [device, host, storage, both, all]
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
  min_storage_cached_fraction:
    description: Gate for tier C(storage), the same rule applied to C(cached_tokens_details.storage).
    type: float
    default: 0.8
  storage_write_wait_s:
    description:
      - >-
        Seconds to wait before the flush of tier C(storage), so the write-back of the prefix to the
        storage tier (asynchronous in SGLang) has finished.
    type: float
    default: 2.0
  storage_reread_first:
    description:
      - >-
        Before round 1 (and before any flush), re-send the seeded prompt (O(seed), the one every run with
        this seed and O(input_len) reads back; the rounds read their own prompts) once and report in
        C(restart_hit) how much of it came back from storage: after a restart that kept the storage
        directory, the prefix the previous run wrote. Only with a storage backend.
    type: bool
    default: false
  min_restart_storage_fraction:
    description:
      - >-
        Gate on the re-read of O(storage_reread_first): its storage-cached tokens must be at least this
        fraction of O(input_len) (whole pages). Unset means not checked; set it only when the cache
        identity did not change since the previous run (a new identity has an empty storage directory).
    type: float
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
  progress_path:
    description:
      - >-
        Write progress to this file on the managed host while probing, started afresh by each run:
        C(start: ...), one C(round N/M: ...) line per round with its figures, then C(end: ...) with
        the verdict or the error. Mode C(0600) (an older file's mode too).
      - Not counted as a change (it is a log of the run, like the journal).
    type: path
  lock_path:
    description:
      - >-
        Hold an exclusive lock on this file while measuring, so probes started together on one host
        (one per instance, with C(async)) measure one after another instead of slowing each other down.
    type: path
  lock_timeout:
    description: Seconds to wait for O(lock_path) before failing.
    type: float
    default: 3600
  parity_tokens:
    description:
      - >-
        Answer parity: the warm answer of each round must equal that round's cold answer over the
        first N output tokens (ids equal; log-probabilities within O(parity_logprob_tolerance) where
        the server returns them). Both output lengths are raised to at least N. 0 turns the check off
        (the result then says C(parity: off)).
      - >-
        Both reads are greedy (O(temperature) must be 0). The prompt is a seeded random block of 256
        ids repeated to O(input_len): a language model copies a block it has already seen, so its
        next tokens are near-certain and a recomputed and a cached prefix give the same greedy tokens
        although GPUs are not bit-exact between them. Limits: a model that does not copy (a tiny or
        broken one), random ids that include special or control tokens, or a block cut short at the
        end of the prompt can still make a near-tie; a wrong cache that happens to yield the copied
        tokens passes. The requests ask C(return_logprob) without C(logprob_start_len), so no prompt
        logprobs are computed and the cached prefix is not shortened.
      - >-
        A server that returns output ids but no C(meta_info.output_token_logprobs) is compared by ids
        only (the result says so). One that returns no output ids, or fewer than N, fails the check as
        not checkable: never a silent pass.
    type: int
    default: 8
  parity_logprob_tolerance:
    description:
      - >-
        Largest absolute difference, in nats, between the cold and the warm log-probability of the
        same chosen token. On the repeated-block prompt the copied tokens have log-probabilities near
        0; reduced-precision kernels (bf16, split-K reductions) move them by hundredths between a
        recomputed and a cached prefix, while a wrong cache drops them by whole nats. 0.5 sits between.
    type: float
    default: 0.5
  capacity_max_prefixes:
    description:
      - >-
        Measure how many distinct prefixes of O(input_len) tokens the cache holds (issue 26), after the
        cold/warm rounds, which run unchanged; the gate does not read it. C(0) is off.
      - >-
        N > 0: flush the cache, send N distinct seeded random prefixes P1..PN of exactly O(input_len)
        ids (1 output token each), then re-read them newest first (PN, PN-1, ...) and count those that
        come back cached (device or host tier, at least O(min_cached_fraction) of O(input_len) in
        whole pages) before the first that does not. Newest first, because a hit adds nothing to the
        pools and so evicts nothing the least-recently-used order would take next; the first miss is
        the newest prefix that fell out. When all N come back the result says C(bound_reached) (held
        is then at least N).
      - >-
        C(auto) (or C(-1)): N is worked out before the rounds from the pools the server reports (the
        larger of the host pool and the device KV capacity, per rank, divided by O(input_len) in whole
        pages) plus 2, so the fill passes the limit; at most 1000. It fails when the server reports no
        host pool size (SGLang reports it only in C(/metrics), with C(--enable-metrics)).
      - Each prefix costs a cold prefill (about 192 s at 128K on two Radeon 7900 XTX); see O(capacity_timeout_s).
    type: raw
    default: 0
  capacity_timeout_s:
    description:
      - >-
        Seconds the whole capacity measurement may take (each request is still bounded by
        O(request_timeout)). When they run out the measurement stops, the module does not fail and
        C(capacity.stopped) says C(timeout) (held is then unknown during the fill, a lower bound during
        the re-reads).
    type: float
    default: 3600
attributes:
  check_mode:
    description: Sends no request, returns the plan and predicts C(changed) (true when O(report_path) is set).
    support: full
  diff_mode:
    description: Nothing to show, the probe changes no configuration.
    support: none
  platform:
    description: Any host whose Python reaches the server's URL.
    support: full
    platforms: posix
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

- name: A long probe in the background, its rounds printed as they come (playbooks/ab_benchmark.yml)
  sglang_cache_probe:
    input_len: 128000
    progress_path: /var/lib/hicache-fleet/probe.progress
  async: 3600
  poll: 0
  register: probe_job
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
    One case per measured tier (device, host, storage) with the same keys as cold (and
    median_storage_cached_tokens, storage_cached_fraction), plus warm_cold_ratio
    (median warm TTFT / median cold TTFT) and speedup (its inverse).
  returned: success or gate failure
  type: dict
fillers:
  description: Filler requests sent per round for tier host (count, tokens of each, total tokens).
  returned: when tier is host or both
  type: dict
pools:
  description:
    - The pools the server reports after it is healthy and before it is probed, against what SGLang
      0.5.23 sizes from its flags and the model's C(config.json) on this host
      (module_utils/sglang_pool_plan.py)
    - C(device_tokens) (max_total_num_tokens), C(kvcache_gb), C(host_tokens) with C(host_source)
      (C(/metrics) C(sglang:hicache_host_total_tokens) with C(--enable-metrics), else the simulator's
      server info; a real server reports it nowhere else), C(host_expected) (lowest, highest),
      C(host_expected_how), C(failures), C(note) (what was not checked), C(hicache_cost) (the device
      capacity against the baseline's C(max_total_num_tokens)).
    - With O(gate), a host pool outside the expected range fails the gate naming both figures, and
      nothing is probed.
  returned: when the server answered /get_server_info
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
parity:
  description: >-
    Answer parity per warm tier (the round shown is the first that diverged, else the first not
    checkable, else round 1): status (equal, diverged, not_checkable), position (first diverging
    output token, from 0), cause (token or logprob), the cold and warm ids and logprobs compared,
    logprobs_compared, max_logprob_diff, note. enabled is false when O(parity_tokens) is 0.
    C(gate.parity) is the same in one line, e.g. C(parity: 8 tokens equal (device tier, host tier)).
  returned: success or gate failure
  type: dict
report_path:
  description: Where the JSON record was written.
  returned: when report_path is set
  type: str
capacity:
  description:
    - >-
      With O(capacity_max_prefixes): prefix_len, requested (N), required_cached_tokens, filled, held
      (None when stopped during the fill), bound_reached (all N came back: held is at least N),
      reads (one per re-read, newest first: prefix, cached, device, host, ttft_s), first_miss (the
      prefix number that did not come back, or None), fill_max_cached, stopped (None or C(timeout)),
      note, elapsed_s.
  returned: when capacity_max_prefixes is not 0 and the rounds ran
  type: dict
storage:
  description: >-
    The storage tier: backend (the server's hicache_storage_backend or None), measured, note (why it was
    not), round_prompts (how each round's prompt was seeded when it has a backend).
  returned: when tier is storage or all, storage_reread_first is set, or the server has a storage backend
  type: dict
restart_hit:
  description: >-
    The re-read of O(storage_reread_first): prompt_tokens, cached_tokens, device_cached_tokens,
    host_cached_tokens, storage_cached_tokens, storage_cached_fraction, ttft_ms.
  returned: when storage_reread_first is set and the server has a storage backend
  type: dict
lock_waited_s:
  description: Seconds spent waiting for O(lock_path).
  returned: when lock_path is set
  type: float
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_pool_plan import hicache_cost
from ansible.module_utils.sglang_probe_client import ProbeError, SGLangClient
from ansible.module_utils.sglang_probe_gate import evaluate_gate, load_baseline
from ansible.module_utils.sglang_probe_measure import (
    ARGUMENT_SPEC,
    HostLock,
    plan_steps,
    run_probe,
    tiers_of,
    validate_params,
)
from ansible.module_utils.sglang_probe_report import (
    ProgressLog,
    build_report,
    parity_line,
    summary_line,
    write_report,
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = dict(module.params)
    errors = validate_params(p)
    if errors:
        module.fail_json(msg="invalid options: " + " ".join(errors))
    plan = {"url": p["url"], "tier": p["tier"], "tiers": tiers_of(p["tier"]), "repeats": p["repeats"],
            "input_len": p["input_len"], "steps": plan_steps(p)}
    # Failures end the module outside the except blocks: a sentence, no traceback attached.
    failure = None
    try:
        baseline = load_baseline(p.get("baseline"))
        client = SGLangClient(p["url"], p.get("api_key"), p["request_timeout"], p.get("admin_api_key"))
    except ProbeError as exc:
        failure = str(exc)
    if failure:
        module.fail_json(msg=failure, plan=plan)
    # The one change worth reporting: the JSON record on the managed host. Flushing the server's
    # cache and refilling it with the probe's own prompts leaves nothing for the operator to act on.
    writes_report = bool(p.get("report_path"))
    if module.check_mode:
        module.exit_json(changed=writes_report, plan=plan, requests_sent=0,
                         msg=f"check mode: would probe {p['url']} ({len(plan['steps'])} steps); nothing sent")
    result = {"plan": plan}
    progress = ProgressLog(None)
    try:
        progress = ProgressLog(p.get("progress_path"))
        with HostLock(p.get("lock_path"), p["lock_timeout"]) as lock:
            if p.get("lock_path"):
                result["lock_waited_s"] = lock.waited_s
            progress.write(f"start: {p['url']}, {p['input_len']} tokens, {p['repeats']} rounds, tier {p['tier']}")
            result.update(run_probe(p, client, on_round=progress.on_round, on_line=progress.write))
        if isinstance(result.get("pools"), dict):
            result["pools"]["hicache_cost"] = hicache_cost(result["pools"], baseline)
        result["gate"] = evaluate_gate(result, p, baseline)
        result["gate"]["parity"] = parity_line(result.get("parity"))
        if writes_report:
            write_report(p["report_path"], build_report(result, p))
            result["report_path"] = p["report_path"]
    except ProbeError as exc:
        failure = str(exc)
    except Exception as exc:  # pylint: disable=broad-exception-caught  # a message, never a traceback
        failure = f"unexpected {type(exc).__name__} while probing {p['url']}: {exc}"
    if failure:
        progress.write(f"end: error: {failure}")
        module.fail_json(msg=failure, changed=False, **result)
    result["msg"] = summary_line(result)
    if p["gate"] and not result["gate"]["passed"]:
        result["msg"] = f"the probe gate failed on {p['url']}: " + "; ".join(result["gate"]["reasons"])
        progress.write("end: FAILED: " + "; ".join(result["gate"]["reasons"]))
        module.fail_json(changed=writes_report, **result)
    progress.write(f"end: {result['msg']}")
    module.exit_json(changed=writes_report, **result)


if __name__ == "__main__":
    main()
