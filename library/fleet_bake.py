#!/usr/bin/python
# hicache-fleet: the bake after a batch rejoins (issue 28 item 1): the batch's live figures from the
# fleet's Prometheus against their validated figures and the other hosts'. Runs on the controller
# (delegate_to: localhost): standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_bake
short_description: Judge a rolled-out batch by its live figures in the fleet's Prometheus (the bake)
description:
  - >-
    Issue 28 item 1: after a batch rejoins the router and served real traffic for the bake window, the
    fleet's Prometheus (role C(monitoring): job C(sglang), one target per SGLang instance, its
    C(instance) label the target C(address:port), with C(fleet_host) and C(sglang_instance)) is asked
    for each batch host's figures over the window and for the other hosts'. Each batch host gets a
    verdict, C(passed), C(failed) or C(inconclusive), its figures and its reasons; the bake gets an
    overall verdict and an action for the playbook.
  - >-
    A host C(failed) when any of these holds: an instance not up at the end of the window; more
    restarts than O(thresholds.max_restarts); an error rate (aborted requests over requests) above
    O(thresholds.max_error_rate); a TTFT p95 above its validated cold TTFT times
    O(thresholds.max_ttft_p95_ratio_validated); a TTFT p95 above the other hosts' pooled p95 times
    O(thresholds.max_ttft_p95_ratio_others); for a tier (device, host, storage) whose share of the
    other hosts' prompt tokens is at least O(thresholds.min_others_tier_share), a share below
    O(thresholds.min_tier_share_ratio) times theirs. A host with several instances is held to its worst
    instance's TTFT and to its instances' summed counters.
  - >-
    A host is C(inconclusive) with fewer than O(min_requests) requests in the window (restarts and
    instances down still fail it), or when Prometheus has no series for any of its targets. The other
    hosts are compared with only when they served at least O(min_requests) requests themselves.
  - >-
    A Prometheus error (not reached, HTTP error, a refused query, a malformed answer) never fails the
    task: every host is C(inconclusive) and C(error) names the cause. The overall verdict is
    C(failed) when a host failed (action C(rollback)), C(inconclusive) when a host is (action by
    O(no_traffic)), else C(passed) (action C(continue)).
  - >-
    The queries, each an instant query (C(GET /api/v1/query)) at Prometheus's current time, with
    C(SEL) = C({job="JOB",instance=~"BATCH AND OTHER TARGETS"}), C(OSEL) the same for the other
    hosts' targets only, and C(W) = C([window_s s]):
    C(requests) = C(sum by (instance) (increase(sglang:num_requests_total SEL W)));
    C(prompt_tokens) = C(sum by (instance) (increase(sglang:prompt_tokens_total SEL W)));
    C(cached_tokens) = C(sum by (instance, cache_source) (increase(sglang:cached_tokens_total SEL W)))
    (tiers device, host, storage; the share of a tier is its tokens over the prompt tokens);
    C(aborted) = C(sum by (instance) (increase(sglang:num_aborted_requests_total SEL W)))
    (SGLang 0.5.23's counter of aborted requests; absent, the error rate is not judged);
    C(ttft_p50), C(ttft_p95) = C(histogram_quantile(0.5 or 0.95, sum by (instance, le)
    (rate(sglang:time_to_first_token_seconds_bucket SEL W))));
    C(counter_resets) = C(sum by (instance) (resets(sglang:num_requests_total SEL W)));
    C(up_changes) = C(sum by (instance) (changes(up SEL W)));
    C(up) = C(min by (instance) (up SEL));
    with other hosts, C(others_ttft_p50), C(others_ttft_p95) = C(histogram_quantile(0.5 or 0.95,
    sum by (le) (rate(sglang:time_to_first_token_seconds_bucket OSEL W)))).
  - >-
    Restarts of an instance are the larger of its request counter's resets and half its scrape up/down
    changes, rounded up (the monitoring role's C(SGLangCrashLooping) reads the same two signals;
    SGLang's multiprocess metrics export no C(process_start_time_seconds)). The window must not reach
    back before the batch's own restart: pass the time since the batch rejoined, or less.
  - C(changed) is false, as it reads only.
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
options:
  prometheus_url:
    description:
      - Base URL of the fleet's Prometheus, e.g. C(http://monitor:9090); a path prefix is kept.
      - C(user:password@) in it is sent as basic authentication and left out of every message.
    type: str
    required: true
  bearer_token:
    description: Sent as C(Authorization) C(Bearer) header (instead of basic authentication).
    type: str
  job:
    description: The scrape job of the SGLang instances (the monitoring role's C(sglang)); empty matches any job.
    type: str
    default: sglang
  instances:
    description: The batch's hosts.
    type: list
    elements: dict
    required: true
    suboptions:
      host:
        description: The inventory host (the key of the result's C(hosts)).
        type: str
        required: true
      targets:
        description:
          - >-
            The values of the C(instance) label of this host's SGLang instances as the monitoring role
            scrapes them, C(address:port) (its C(fleet_endpoints) filter's C(target)).
        type: list
        elements: str
        required: true
      validated:
        description:
          - >-
            The host's validated figures, from its validated record: C(cold_ttft_ms) (the probe's cold
            median TTFT, which the live p95 is held to) and C(warm_ttft_ms) (shown beside the live
            p50); other keys are returned as they are.
        type: dict
        default: {}
  others:
    description: The C(instance) label values of the hosts not in the batch (the fleet reference).
    type: list
    elements: str
    default: []
  window_s:
    description: The bake window in seconds (C(rollout_bake_s)); every query covers the last C(window_s) seconds.
    type: int
    required: true
  min_requests:
    description: Requests a host (and the other hosts together) must have served in the window to be judged.
    type: int
    default: 20
  thresholds:
    description: Where a host fails.
    type: dict
    default: {}
    suboptions:
      max_ttft_p95_ratio_others:
        description: The host's TTFT p95 over the other hosts' pooled p95, at most.
        type: float
        default: 3.0
      max_ttft_p95_ratio_validated:
        description: The host's TTFT p95 over its validated cold TTFT, at most.
        type: float
        default: 3.0
      max_error_rate:
        description: Aborted requests over requests, at most (0.01 is 1 %).
        type: float
        default: 0.01
      max_restarts:
        description: Restarts of the host's instances in the window, at most.
        type: int
        default: 0
      min_tier_share_ratio:
        description: A tier's share of the host's prompt tokens over the other hosts' share of it, at least.
        type: float
        default: 0.5
      min_others_tier_share:
        description: >-
          A tier is compared only when the other hosts serve at least this share of their prompt
          tokens from it.
        type: float
        default: 0.05
  no_traffic:
    description:
      - >-
        What an C(inconclusive) bake's action is: C(pass) continues (action C(continue)), C(hold)
        stops the run there (action C(hold)), C(warm) asks the playbook to send the warm set as traffic
        and bake again (action C(warm)). The module sends nothing itself.
    type: str
    default: hold
    choices: [pass, hold, warm]
  timeout_s:
    description: Seconds one query may take.
    type: float
    default: 10
attributes:
  check_mode:
    description: Checks the options and returns the queries it would send; sends nothing.
    support: full
  diff_mode:
    description: Nothing to show.
    support: none
  platform:
    description: The controller (delegate_to localhost), or any host that reaches Prometheus.
    support: full
    platforms: posix
notes:
  - Needs only the Python standard library.
"""

EXAMPLES = r"""
- name: Bake the batch
  fleet_bake:
    prometheus_url: "{{ rollout_prometheus_url }}"
    window_s: "{{ rollout_bake_s }}"
    no_traffic: "{{ rollout_bake_no_traffic }}"
    instances:
      - host: gpu-2
        targets: ["10.0.0.2:30004"]
        validated: {cold_ttft_ms: 1920.0, warm_ttft_ms: 40.0}
    others: ["10.0.0.1:30004", "10.0.0.3:30004"]
  delegate_to: localhost
  run_once: true
  register: bake
"""

RETURN = r"""
verdict:
  description: C(passed), C(failed) or C(inconclusive); C(not_run) in check mode.
  returned: always
  type: str
action:
  description: C(continue), C(rollback) (the failed hosts), C(hold) or C(warm) (an inconclusive bake, by no_traffic).
  returned: always
  type: str
no_traffic:
  description: The O(no_traffic) that decided an inconclusive bake's action.
  returned: always
  type: str
hosts:
  description: >-
    Per batch host: verdict, reasons (each naming the figure and the threshold), validated (as given)
    and figures (requests, prompt_tokens, cached_tokens and tier_share by tier, aborted_requests,
    error_rate, restarts, down_targets, unscraped_targets, ttft_p50_ms, ttft_p95_ms,
    ttft_p95_vs_validated_cold, ttft_p95_vs_others, per_target).
  returned: when not in check mode
  type: dict
others:
  description: The other hosts' pooled figures (as a host's, without per_target); null without others.
  returned: when not in check mode
  type: dict
failed_hosts:
  description: The hosts that failed.
  returned: when not in check mode
  type: list
inconclusive_hosts:
  description: The hosts that were inconclusive.
  returned: when not in check mode
  type: list
error:
  description: The Prometheus error that made the bake inconclusive; null otherwise.
  returned: when not in check mode
  type: str
queries:
  description: Every PromQL query, by name.
  returned: always
  type: dict
msg:
  description: One line, e.g. C(bake failed over 600 s; gpu-2 failed (TTFT p95 ...)).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.fleet_bake import ARGUMENT_SPEC, bake, build_queries, redact_url, validate_params


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = dict(module.params)
    errors = validate_params(p)
    if errors:
        module.fail_json(msg="invalid options: " + " ".join(errors))
    if module.check_mode:
        queries = build_queries(p)
        module.exit_json(changed=False, verdict="not_run", action="continue", no_traffic=p["no_traffic"],
                         queries=queries,
                         msg=f"check mode: would send {len(queries)} queries to "
                             f"{redact_url(p['prometheus_url'])}; nothing sent")
    module.exit_json(changed=False, **bake(p))


if __name__ == "__main__":
    main()
