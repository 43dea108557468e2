"""capacity_max_prefixes (issue 26): how many distinct prefixes of the probe's length the cache holds,
filled and re-read newest first, on the SGLang simulator (sim/) as a subprocess on 127.0.0.1.

Expected counts: the simulator's host pool (sglang_sim.host_pool_tokens, the figure SGLang exports as
sglang:hicache_host_total_tokens) // input_len, or one more: the oldest prefix still held may have
lost only its last blocks (LRU evicts leaves first) and still meet min_cached_fraction. With page
size 1 a prefix takes exactly input_len tokens in the pool (its last token included once the request
is done), so no page padding enters here; the helper rounds input_len down to pages for page size > 1.
"""

from __future__ import annotations

import copy
import itertools
import json

import pytest
from ansible.module_utils.sglang_probe_capacity import (
    CAPACITY_AUTO,
    CAPACITY_MAX_PREFIXES,
    capacity_auto_prefixes,
    capacity_ids,
    capacity_line,
    capacity_option,
    measure_capacity,
    predicted_prefixes,
)
from ansible.module_utils.sglang_probe_client import SGLangClient, flush_cache, generate_body
from ansible.module_utils.sglang_probe_gate import evaluate_gate
from ansible.module_utils.sglang_probe_measure import plan_steps, validate_params
from sim_server import HICACHE_ARGS, SEED_ARGS, probe_once, sim_available

INPUT_LEN = 16000


def hicache_args(size_gb: int) -> list[str]:
    args = list(HICACHE_ARGS)
    args[args.index("--hicache-size") + 1] = str(size_gb)
    return SEED_ARGS + args


def capacity_params(params, url: str, **over):
    # the warm/cold ratio is timing on a loaded 2-core machine; these tests are about counts
    return params(url=url, input_len=INPUT_LEN, request_timeout=60, ready_timeout=20, flush_timeout=10,
                  max_warm_cold_ratio=50.0, **over)


sim_only = pytest.mark.skipif(not sim_available(), reason="the simulator (sim/sglang_sim) is not in this tree")


@sim_only
def test_held_follows_the_host_pool_size_through_ansible(start_sim, ansible_run, params, tmp_path):
    """Two --hicache-size values: the held counts differ and each is host pool // input_len (+1 at most)."""
    held = {}
    for size in (12, 20):
        sim = start_sim(hicache_args(size))
        if size == 12:  # through the module, with its progress file and report
            progress = tmp_path / "probe.progress"
            report = tmp_path / "probe.json"
            result = ansible_run({"url": sim.url, "input_len": INPUT_LEN, "repeats": 1, "cold_output_len": 4,
                                  "warm_output_len": 2, "ready_timeout": 20, "request_timeout": 60,
                                  "max_warm_cold_ratio": 50.0, "capacity_max_prefixes": "auto",
                                  "progress_path": str(progress), "report_path": str(report)})
            assert not result.get("failed"), result.get("msg")
        else:
            result = probe_once(capacity_params(params, sim.url, capacity_max_prefixes="auto"))
        pool = result["pools"]["host_tokens"]
        cap = result["capacity"]
        expected = pool // INPUT_LEN
        assert cap["requested"] == expected + 2  # auto: the prediction + 2, so the fill passes the limit
        assert cap["filled"] == cap["requested"]
        assert expected <= cap["held"] <= expected + 1, (size, pool, cap["held"])
        assert cap["bound_reached"] is False
        # read newest first, stopped at the first miss, which is the newest prefix that fell out
        assert [r["prefix"] for r in cap["reads"]] == list(range(cap["filled"], cap["first_miss"] - 1, -1))
        assert cap["first_miss"] == cap["filled"] - cap["held"]
        assert all(r["cached"] >= cap["required_cached_tokens"] for r in cap["reads"][:-1])
        assert cap["reads"][-1]["cached"] < cap["required_cached_tokens"]
        assert cap["fill_max_cached"] == 0  # distinct from each other and from the probe's prompt
        # the newest ones are device hits, the older ones come back from the host tier
        assert cap["reads"][0]["device"] >= cap["required_cached_tokens"]
        assert cap["reads"][-2]["host"] >= cap["required_cached_tokens"]
        held[size] = cap["held"]
        if size == 12:
            lines = progress.read_text().splitlines()
            assert lines[0].startswith("start: ")
            assert lines[1].startswith("round 1/1: ")
            fills = [ln for ln in lines if ln.startswith("capacity: fill ")]
            assert len(fills) == cap["filled"]
            assert "s left" in fills[0]
            assert sum(ln.startswith("capacity: re-read ") for ln in lines) == len(cap["reads"])
            want = f"capacity: {cap['held']} prefixes of {INPUT_LEN} tokens held (P{cap['first_miss']} of"
            assert any(ln.startswith(want) for ln in lines), lines
            assert lines[-1].startswith("end: ")
            assert want in lines[-1]
            assert want in result["msg"]
            assert json.loads(report.read_text())["capacity"]["held"] == cap["held"]
    assert held[20] > held[12]


@sim_only
def test_a_tiny_bound_is_reached_and_said(start_sim, params):
    sim = start_sim(hicache_args(12))
    result = probe_once(capacity_params(params, sim.url, capacity_max_prefixes=3))
    cap = result["capacity"]
    assert (cap["filled"], cap["held"], cap["bound_reached"], cap["first_miss"]) == (3, 3, True, None)
    assert [r["prefix"] for r in cap["reads"]] == [3, 2, 1]
    assert capacity_line(cap).startswith(f"capacity: ≥ 3 prefixes of {INPUT_LEN} tokens held")


@sim_only
def test_the_time_bound_stops_it_and_says_so(start_sim, params):
    sim = start_sim(hicache_args(12))
    p = capacity_params(params, sim.url, capacity_timeout_s=5.0)
    ticks = itertools.count(0.0, 1.0)  # one second per look at the clock
    out = measure_capacity(p, SGLangClient(sim.url, None, 60), {"page_size": 1}, 32000, 30,
                           clock=lambda: next(ticks))
    assert out["stopped"] == "timeout"
    assert 0 < out["filled"] < 30
    assert out["held"] is None
    assert "capacity_timeout_s 5 s during the fill" in out["note"]
    assert capacity_line(out).startswith("capacity: not measured (stopped by capacity_timeout_s 5 s")


@sim_only
def test_the_gate_verdict_is_unchanged_by_the_option(start_sim, params):
    sim = start_sim(hicache_args(12))
    without = probe_once(capacity_params(params, sim.url))
    with_cap = probe_once(capacity_params(params, sim.url, capacity_max_prefixes=4))
    assert "capacity" not in without
    assert with_cap["capacity"]["filled"] == 4
    assert with_cap["gate"]["passed"] is without["gate"]["passed"] is True
    names = [(c["name"], c["passed"]) for c in without["gate"]["checks"]]
    assert [(c["name"], c["passed"]) for c in with_cap["gate"]["checks"]] == names
    for case in ("cold",):
        assert with_cap[case]["median_cached_tokens"] == without[case]["median_cached_tokens"]
    for tier in ("device", "host"):
        assert with_cap["warm"][tier]["median_cached_tokens"] == without["warm"][tier]["median_cached_tokens"]
    # the gate does not read the capacity key at all: a failing measurement changes nothing
    p = capacity_params(params, sim.url, capacity_max_prefixes=4)
    spoiled = copy.deepcopy(with_cap)
    spoiled["capacity"].update(held=0, first_miss=4, stopped="timeout")
    assert evaluate_gate(spoiled, p) == evaluate_gate(with_cap, p)


@sim_only
def test_newest_first_is_what_makes_the_count_true(start_sim, params):
    """The argument of measure_capacity, on the simulator: after the same fill, reading oldest first
    meets the fallen-out P1 at once, and its recomputation evicts the next oldest: the count is 0."""
    sim = start_sim(hicache_args(12))
    p = capacity_params(params, sim.url)
    client = SGLangClient(sim.url, None, 60)
    newest_first = measure_capacity(p, client, {"page_size": 1}, 32000, 24)
    assert newest_first["held"] == 22
    flush_cache(client, 10)
    for i in range(1, 25):
        client.stream_generate(generate_body(capacity_ids(i, p, 32000), 1, 0.0))
    oldest = [client.stream_generate(generate_body(capacity_ids(i, p, 32000), 1, 0.0))["cached_tokens"]
              for i in (1, 2, 3)]
    assert oldest[0] == 0  # P1 fell out; recomputing it evicts P2's pages, and so on
    assert oldest[1] < newest_first["required_cached_tokens"]


@sim_only
def test_write_through_selective_holds_single_use_prefixes_on_the_device_only(start_sim, params):
    args = hicache_args(12)
    args[args.index("--hicache-write-policy") + 1] = "write_through_selective"
    sim = start_sim(args)
    cap = probe_once(capacity_params(params, sim.url, capacity_max_prefixes="auto", tier="device"))["capacity"]
    device = 159692  # the seed's device capacity with HiCache
    assert device // INPUT_LEN <= cap["held"] <= device // INPUT_LEN + 1
    assert all(r["host"] == 0 for r in cap["reads"])


def test_check_mode_plans_the_measurement_and_sends_nothing(ansible_run):
    result = ansible_run({"url": "http://127.0.0.1:9", "capacity_max_prefixes": "auto"}, check=True)
    assert not result.get("failed"), result.get("msg")
    assert result["requests_sent"] == 0
    assert any(s.startswith("capacity: re-read them newest first") for s in result["plan"]["steps"])


def test_the_prediction_and_the_auto_count():
    assert predicted_prefixes(366211, 159692, 16000) == 22  # the host pool, larger than the device's
    assert predicted_prefixes(122071, 159692, 16000) == 9  # the device pool, larger than the host's
    assert predicted_prefixes(None, None, 16000) is None
    assert predicted_prefixes(1000, None, 300, page_size=64) == 3  # 256 tokens a prefix in whole pages
    assert capacity_auto_prefixes(366211, 159692, 16000) == 24
    assert capacity_auto_prefixes(10**9, None, 100) == CAPACITY_MAX_PREFIXES
    assert capacity_auto_prefixes(None, 0, 100) is None


@pytest.mark.parametrize(("value", "expected"), [(0, 0), (None, 0), (5, 5), ("7", 7), ("auto", CAPACITY_AUTO),
                                                 (" AUTO ", CAPACITY_AUTO), (-1, CAPACITY_AUTO)])
def test_option_values(value, expected):
    assert capacity_option(value) == expected


@pytest.mark.parametrize(("over", "message"), [
    ({"capacity_max_prefixes": -2}, "capacity_max_prefixes must not be negative (got -2)"),
    ({"capacity_max_prefixes": "many"}, "capacity_max_prefixes must be a whole number or 'auto' (got 'many')"),
    ({"capacity_max_prefixes": 2.5}, "capacity_max_prefixes must be a whole number or 'auto' (got 2.5)"),
    ({"capacity_max_prefixes": 10**6}, f"capacity_max_prefixes must be at most {CAPACITY_MAX_PREFIXES}"),
    ({"capacity_timeout_s": 0.0}, "capacity_timeout_s must be greater than 0 seconds (got 0)"),
    ({"capacity_timeout_s": -5.0}, "capacity_timeout_s must be greater than 0 seconds (got -5)"),
])
def test_bad_options_name_the_option(params, over, message):
    errors = validate_params(params(**over))
    assert any(e.startswith(message) for e in errors), errors


def test_the_plan_shows_the_measurement_only_when_asked(params):
    assert not [s for s in plan_steps(params()) if s.startswith("capacity")]
    steps = [s for s in plan_steps(params(capacity_max_prefixes="auto")) if s.startswith("capacity")]
    assert len(steps) == 2
    assert "fill auto (the host pool's prefixes + 2) distinct prefixes of 512" in steps[0]
    assert "newest first" in steps[1]
    assert "3600 s" in steps[1]
