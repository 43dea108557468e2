"""Unit tests of the probe's plain functions (no server, no Ansible)."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.sglang_probe_client import (
    ProbeError,
    cached_split,
    event_has_output,
    generate_body,
    generate_ids,
    parse_sse_line,
)
from ansible.module_utils.sglang_probe_gate import (
    baseline_input_len,
    comparable_baseline,
    evaluate_gate,
    load_baseline,
    required_cached_tokens,
)
from ansible.module_utils.sglang_probe_measure import (
    extract_server_facts,
    filler_lengths,
    mean,
    median,
    plan_steps,
    resolve_vocab_size,
    summarize_case,
    validate_params,
)
from ansible.module_utils.sglang_probe_report import build_report


def test_ids_are_exact_seeded_and_in_vocab():
    ids = generate_ids(128000, 151936, 42)
    assert len(ids) == 128000
    assert min(ids) >= 0
    assert max(ids) < 151936
    assert ids == generate_ids(128000, 151936, 42)
    assert ids != generate_ids(128000, 151936, 43)
    # not degenerate: a 128K draw from a 150K vocabulary uses most of it
    assert len(set(ids)) > 60000


def test_ids_small_vocab_and_empty():
    assert set(generate_ids(5000, 2, 1)) == {0, 1}
    assert generate_ids(0, 100, 1) == []
    with pytest.raises(ValueError, match="vocab_size"):
        generate_ids(10, 0, 1)


def test_generate_body_is_native_streaming_request():
    body = json.loads(generate_body([1, 2, 3], 16, 0.0))
    assert body == {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"data: [DONE]\n", "[DONE]"),
        (b"data:[DONE]", "[DONE]"),
        (b"\n", None),
        (b": keep-alive\n", None),
        (b"event: message\n", None),
        (b'data: {"text": "a"}\n', {"text": "a"}),
        (b'{"text": "a"}', {"text": "a"}),
    ],
)
def test_parse_sse_line(line, expected):
    assert parse_sse_line(line) == expected


def test_parse_sse_line_rejects_non_json():
    with pytest.raises(ProbeError, match="not JSON"):
        parse_sse_line(b"data: <html>oops</html>")
    with pytest.raises(ProbeError, match="non-object"):
        parse_sse_line(b"data: [1, 2]")


@pytest.mark.parametrize(
    ("event", "has"),
    [
        ({"text": "", "meta_info": {"completion_tokens": 0}}, False),
        ({"text": "x"}, True),
        ({"text": "", "output_ids": [5]}, True),
        ({"text": "", "meta_info": {"completion_tokens": 1}}, True),
        ({"meta_info": {"prompt_tokens": 3}}, False),
    ],
)
def test_event_has_output(event, has):
    assert event_has_output(event) is has


def test_median_and_mean():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4, 1, 3, 2]) == 2.5
    assert median([]) is None
    assert median([None, 5]) == 5
    assert mean([1, 2, 6]) == 3


@pytest.mark.parametrize(
    ("fraction", "input_len", "page", "expected"),
    [
        (0.9, 128000, 1, 115200),
        (0.9, 128000, 64, 115200),  # 115200 is a multiple of 64
        (0.9, 1000, 64, 896),  # 900 rounded down to 14 pages
        (1.0, 128000, 1, 127999),  # capped: the last prompt token is always recomputed
        (1.0, 128000, 64, 127936),
        (0.0, 128000, 64, 0),
        (0.5, 100, 0, 50),  # a page size of 0/None counts as 1
    ],
)
def test_required_cached_tokens(fraction, input_len, page, expected):
    assert required_cached_tokens(fraction, input_len, page) == expected


def test_validate_params_catches_nonsense(params):
    assert validate_params(params()) == []
    errors = validate_params(params(max_warm_cold_ratio=0, min_cached_fraction=1.2,
                                          min_host_cached_fraction=-0.1, repeats=0, request_timeout=0,
                                          max_warm_ttft_s=-1, max_regression=-0.5))
    text = " ".join(errors)
    for name in ("max_warm_cold_ratio", "min_cached_fraction", "min_host_cached_fraction", "repeats",
                 "request_timeout", "max_warm_ttft_s", "max_regression"):
        assert name in text
    assert len(errors) == 7


def test_filler_lengths_cover_capacity():
    lengths = filler_lengths(159692, 128000, 1.0)
    assert lengths == [128000, 31692]
    assert sum(filler_lengths(1000, 300, 1.5)) == 1500
    assert all(n <= 4095 for n in filler_lengths(20000, 8000, 1.0, max_input_len=4096))


def test_filler_lengths_refuse_unknown_or_absurd_capacity():
    with pytest.raises(ProbeError, match="max_total_num_tokens"):
        filler_lengths(0, 128000, 1.0)
    with pytest.raises(ProbeError, match="filler requests"):
        filler_lengths(10_000_000, 10, 1.0)


def test_extract_server_facts_real_layout():
    info = {"version": "0.5.23", "page_size": 64, "max_total_num_tokens": 159692,
            "enable_hierarchical_cache": True, "enable_cache_report": True, "hicache_size": 12,
            "hicache_ratio": 2.0, "max_req_input_len": 131066, "model_path": "/m"}
    facts = extract_server_facts(info, {"model_path": "/models/q", "served_model_name": "q"})
    assert facts["page_size"] == 64
    assert facts["max_total_num_tokens"] == 159692
    assert facts["hicache_args"] == {"hicache_ratio": 2.0, "hicache_size": 12}
    assert facts["model_path"] == "/models/q"
    assert facts["enable_hierarchical_cache"] is True


def test_extract_server_facts_capacity_from_internal_states():
    info = {"internal_states": [{"memory_usage": {"token_capacity": 233207}}]}
    facts = extract_server_facts(info, {})
    assert facts["max_total_num_tokens"] == 233207
    assert facts["page_size"] == 1
    assert facts["enable_hierarchical_cache"] is False


def test_vocab_size_resolution(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 248320}}))
    assert resolve_vocab_size(1000, {}) == (1000, "option vocab_size")
    assert resolve_vocab_size(None, {"vocab_size_reported": 50000})[0] == 50000
    assert resolve_vocab_size(None, {"model_path": str(tmp_path)})[0] == 248320
    assert resolve_vocab_size(None, {"model_path": str(tmp_path / "nope")})[0] == 32000


def test_cached_split():
    assert cached_split({"cached_tokens": 100, "cached_tokens_details": {"device": 40, "host": 60}}) == {
        "cached_tokens": 100, "device": 40, "host": 60, "storage": 0}
    # SGLang without HiCache: details absent or null -> all of it is device
    assert cached_split({"cached_tokens": 7, "cached_tokens_details": None})["device"] == 7
    assert cached_split({"cached_tokens": 0})["host"] == 0


def _run(ttft, e2e, cached=0, host=0, out=16, prompt=1000):
    return {"ttft_s": ttft, "e2e_s": e2e, "prompt_tokens": prompt, "completion_tokens": out,
            "cached_tokens": cached, "device_cached_tokens": cached - host, "host_cached_tokens": host}


def test_summarize_case_uses_benchmark_names_and_medians():
    case = summarize_case([_run(0.2, 1.0), _run(0.1, 0.5), _run(0.3, 2.0)], 1000, 16)
    assert case["median_ttft_ms"] == 200.0
    assert case["mean_ttft_ms"] == 200.0
    assert case["median_e2e_latency_ms"] == 1000.0
    assert case["input_throughput"] == 1000.0  # median of 1000/1.0, 1000/0.5, 1000/2.0
    assert case["completed"] == 3
    assert set(case["cache_report"]) == {"total_prompt_tokens", "total_cached_tokens", "cache_hit_rate_pct",
                                         "device_cached_tokens", "host_cached_tokens", "storage_cached_tokens"}
    assert case["median_tpot_ms"] == pytest.approx((0.8 / 15) * 1000, rel=1e-3)


def test_summarize_case_cache_report():
    case = summarize_case([_run(0.01, 0.1, 999, 900), _run(0.01, 0.1, 999, 999)], 1000, 16)
    report = case["cache_report"]
    assert report["total_prompt_tokens"] == 2000
    assert report["total_cached_tokens"] == 1998
    assert report["cache_hit_rate_pct"] == 99.9
    assert report["host_cached_tokens"] == 1899
    assert case["cached_fraction"] == 0.999


def _result(cold_ms, warm: dict, hicache=True, page=1):
    return {
        "server": {"page_size": page, "enable_hierarchical_cache": hicache},
        "cold": {"median_ttft_ms": cold_ms},
        "warm": {
            tier: {"median_ttft_ms": ms, "warm_cold_ratio": round(ms / cold_ms, 5), "median_cached_tokens": c,
                   "median_host_cached_tokens": h}
            for tier, (ms, c, h) in warm.items()
        },
    }


def test_gate_passes_a_good_host(params):
    p = params(input_len=128000)
    gate = evaluate_gate(_result(192000, {"device": (300, 127999, 0), "host": (2650, 127999, 127999)}), p)
    assert gate["passed"]
    assert gate["reasons"] == []
    assert {c["name"] for c in gate["checks"]} >= {"device.max_warm_cold_ratio", "host.min_host_cached_fraction"}


def test_gate_lists_each_violation_with_its_figure(params):
    p = params(input_len=128000, max_warm_ttft_s=1.0)
    gate = evaluate_gate(_result(192000, {"host": (190000, 0, 0)}, hicache=False), p)
    assert not gate["passed"]
    text = "\n".join(gate["reasons"])
    assert "ratio 0.9896 > max_warm_cold_ratio 0.2" in text
    assert "190.000 s > max_warm_ttft_s 1 s" in text
    assert "cached tokens 0 < 115200" in text
    assert "host-cached tokens 0 < 102400" in text
    assert "--enable-hierarchical-cache" in text
    assert len(gate["reasons"]) == 4


def test_gate_baseline_regression(params):
    p = params(max_regression=0.1)
    base = {"cold": {"median_ttft_ms": 1000.0}, "warm": {"device": {"median_ttft_ms": 10.0}}}
    ok = evaluate_gate(_result(1050.0, {"device": (10.5, 511, 0)}), p, base)
    assert ok["passed"], ok["reasons"]
    bad = evaluate_gate(_result(1200.0, {"device": (10.5, 511, 0)}), p, base)
    assert bad["reasons"] == ["cold TTFT 1.2 s is 1.2× the baseline (1 s); the limit is 1.1 s "
                              "(max_regression 0.1, regression_slack_ms 0)"]
    assert bad["baseline"]["cold_ms"] == 1000.0


def test_gate_regression_slack_and_source(params):
    p = params(max_regression=1.0, regression_slack_ms=250)
    base = {"source": "the last validated result on this host", "cold": {"median_ttft_ms": 480.0},
            "warm": {"device": {"median_ttft_ms": 5.0}}}
    # a warm read of 60 ms is 12x its 5 ms baseline, but within the 250 ms of noise
    ok = evaluate_gate(_result(900.0, {"device": (60.0, 511, 0)}), p, base)
    assert ok["passed"], ok["reasons"]
    assert {c["name"]: c["limit"] for c in ok["checks"]}["device.max_regression"] == 260.0
    bad = evaluate_gate(_result(4810.0, {"device": (6.0, 511, 0)}), p, base)
    assert bad["reasons"] == ["cold TTFT 4.81 s is 10.0× the last validated result on this host (480 ms); the "
                              "limit is 1.21 s (max_regression 1, regression_slack_ms 250)"]


def test_comparable_baseline_like_with_like():
    base = {"input_len": 64000, "cold": {"median_ttft_ms": 960.0},
            "warm": {"device": {"median_ttft_ms": 8.0}, "host": {"median_ttft_ms": 20.0}}}
    same = comparable_baseline(base, 64000)
    assert (same["cold_ms"], same["warm_ms"], same["scale"], same["note"]) == (
        960.0, {"device": 8.0, "host": 20.0}, 1.0, None)
    # a longer baseline: cold scaled down linearly, warm not compared
    shorter_run = comparable_baseline(base, 32000)
    assert (shorter_run["cold_ms"], shorter_run["warm_ms"], shorter_run["scale"]) == (480.0, {}, 0.5)
    assert "scaled to 32000 tokens" in shorter_run["note"]
    # a shorter baseline: nothing compared (scaling up would understate the expected time)
    longer_run = comparable_baseline(base, 128000)
    assert (longer_run["cold_ms"], longer_run["warm_ms"]) == (None, {})
    assert "not compared" in longer_run["note"]
    # the module's own report and a rollout record both say their prompt length
    assert baseline_input_len({"random_input_len": 512, "cold": {"median_ttft_ms": 1}}) == 512
    assert baseline_input_len({"cold": {"median_ttft_ms": 1, "random_input_len": 1024}}) == 1024
    assert baseline_input_len({"cold": {"median_ttft_ms": 1}}) is None


def test_gate_against_a_longer_baseline_names_the_scaling(params):
    p = params(input_len=32000, max_regression=1.0, regression_slack_ms=250)
    base = {"source": "the fleet median of 1 validated host (gt-1)", "input_len": 64000,
            "cold": {"median_ttft_ms": 960.0}, "warm": {"device": {"median_ttft_ms": 1.0}}}
    gate = evaluate_gate(_result(4800.0, {"device": (50.0, 31999, 0)}), p, base)
    assert gate["reasons"] == ["cold TTFT 4.8 s is 10.0× the fleet median of 1 validated host (gt-1) (480 ms "
                               "scaled from 64000 to 32000 tokens); the limit is 1.21 s (max_regression 1, "
                               "regression_slack_ms 250)"]
    assert [c["name"] for c in gate["checks"] if c["name"].endswith("max_regression")] == ["cold.max_regression"]


def test_load_baseline_forms(tmp_path):
    record = {"cold": {"median_ttft_ms": 5.0}}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(record))
    assert load_baseline(record) == record
    assert load_baseline(str(path)) == record
    assert load_baseline(json.dumps(record)) == record
    assert load_baseline(None) is None
    with pytest.raises(ProbeError, match="cannot read baseline file"):
        load_baseline(str(tmp_path / "missing.json"))
    with pytest.raises(ProbeError, match=r"cold\.median_ttft_ms"):
        load_baseline({"something": 1})


def test_build_report_keys_follow_the_benchmark(params):
    p = params()
    case = summarize_case([_run(0.2, 1.0, 0, 0)], 512, 4)
    result = {"server": {"version": "0.5.23"}, "cold": case, "warm": {"device": case}, "gate": {"passed": True}}
    report = build_report(result, p)
    json.dumps(report)  # serialisable
    assert report["backend"] == "sglang"
    assert report["cold"]["median_ttft_ms"] == 200.0
    assert "input_throughput" in report["warm"]["device"]
    assert "host_cached_tokens" in report["cold"]["cache_report"]
    # the report is itself a valid baseline
    assert load_baseline(report) is report


def test_plan_steps_count_rounds(params):
    steps = plan_steps(params(repeats=2, tier="both", report_path="/tmp/x.json"))
    assert sum("POST /flush_cache" in s for s in steps) == 2
    assert sum("fillers" in s for s in steps) == 2
    assert steps[-1].startswith("write the JSON record")
    device_only = plan_steps(params(tier="device"))
    assert not any("fillers" in s for s in device_only)


def test_validate_params_rejects_negative_slack(params):
    assert validate_params(params(regression_slack_ms=-1)) == ["regression_slack_ms must be >= 0 (got -1)."]
