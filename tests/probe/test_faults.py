"""The probe against small fake servers: the happy path and every failure the issue lists."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.sglang_probe_client import ProbeError, SGLangClient
from ansible.module_utils.sglang_probe_gate import evaluate_gate
from ansible.module_utils.sglang_probe_measure import run_probe
from probe_fakes import FakeServer
from procs import free_port


def probe_once(p):
    client = SGLangClient(p["url"], p.get("api_key"), p["request_timeout"], p.get("admin_api_key"))
    result = run_probe(p, client)
    result["gate"] = evaluate_gate(result, p)
    return result


def test_fake_with_hicache_passes_both_tiers(params):
    with FakeServer(capacity=1200, s_per_token=0.0002) as srv:
        p = params(url=srv.url, input_len=1000, repeats=2, tier="both", max_warm_cold_ratio=0.6)
        result = probe_once(p)
    assert result["gate"]["passed"], result["gate"]["reasons"]
    assert result["warm"]["device"]["median_device_cached_tokens"] == 999
    assert result["warm"]["host"]["median_host_cached_tokens"] == 999
    assert result["cold"]["median_cached_tokens"] == 0
    assert result["fillers"]["total_tokens"] >= 1200
    # exact lengths: every timed request carried input_len ids; fillers 1 output token
    timed = [b for b in srv.state.generate_bodies if b["sampling_params"]["max_new_tokens"] != 1]
    assert {b["n"] for b in timed} == {1000}
    assert all(b["stream"] is True and b["sampling_params"]["ignore_eos"] for b in srv.state.generate_bodies)
    # the cold read asks for at least parity_tokens (8 by default) so the warm answer can be compared
    assert result["cold"]["total_output_tokens"] == 2 * max(p["cold_output_len"], p["parity_tokens"])
    # the order of one round: flush, cold, warm device, fillers..., warm host
    posts = [path for method, path in srv.requests if method == "POST"]
    assert posts[:3] == ["/flush_cache", "/generate", "/generate"]
    assert sum(path == "/flush_cache" for path in posts) == 2


def test_fake_without_hicache_fails_host_tier_with_reasons(params):
    with FakeServer(capacity=1200, hicache=False) as srv:
        p = params(url=srv.url, input_len=1000, tier="host")
        result = probe_once(p)
    gate = result["gate"]
    assert not gate["passed"]
    text = " ".join(gate["reasons"])
    assert "host-cached tokens 0 <" in text
    assert "without --enable-hierarchical-cache" in text
    assert result["server"]["enable_hierarchical_cache"] is False


def test_connection_refused(params):
    p = params(url=f"http://127.0.0.1:{free_port()}", ready_timeout=0.5)
    with pytest.raises(ProbeError, match=r"connection refused\): is the SGLang server running"):
        probe_once(p)


def test_never_healthy(params):
    with FakeServer(faults=("never_healthy",)) as srv:
        p = params(url=srv.url, ready_timeout=1.0)
        with pytest.raises(ProbeError, match=r"did not become healthy within ready_timeout 1 s.*HTTP 503"):
            probe_once(p)
        assert not any(path == "/generate" for _, path in srv.requests)


def test_flush_refused_until_timeout(params):
    with FakeServer(faults=("flush_busy",)) as srv:
        p = params(url=srv.url, flush_timeout=1.0)
        with pytest.raises(ProbeError) as err:
            probe_once(p)
        assert not any(path == "/generate" for _, path in srv.requests)
    msg = str(err.value)
    assert "refused for flush_timeout 1 s" in msg
    assert "Flush cache failed." in msg
    assert "drain" in msg


def test_flush_retried_while_busy_then_succeeds(params):
    with FakeServer(busy_flushes=2) as srv:
        p = params(url=srv.url, flush_timeout=5.0, tier="device")
        result = probe_once(p)
        flushes = [path for method, path in srv.requests if path == "/flush_cache"]
    assert len(flushes) == 3
    assert result["cold"]["completed"] == 1


def test_generate_5xx_shows_body_excerpt(params):
    with FakeServer(faults=("gen_500",)) as srv:
        p = params(url=srv.url)
        with pytest.raises(ProbeError, match=r"/generate answered HTTP 500.*HIP out of memory"):
            probe_once(p)


def test_401_without_and_with_wrong_key(params):
    with FakeServer(api_key="s3cret") as srv:
        with pytest.raises(ProbeError, match="requires an API key; set the module's api_key"):
            probe_once(params(url=srv.url))
        with pytest.raises(ProbeError, match="rejected the api_key"):
            probe_once(params(url=srv.url, api_key="wrong"))
        result = probe_once(params(url=srv.url, api_key="s3cret", tier="device"))
    assert result["warm"]["device"]["median_cached_tokens"] == 511


def test_admin_key_only_on_flush(params):
    with FakeServer(api_key="s3cret", admin_api_key="adm1n") as srv:
        with pytest.raises(ProbeError, match=r"/flush_cache answered HTTP 401.*set admin_api_key"):
            probe_once(params(url=srv.url, api_key="s3cret", tier="device"))
        with pytest.raises(ProbeError, match="rejected the admin_api_key"):
            probe_once(params(url=srv.url, api_key="s3cret", admin_api_key="wrong", tier="device"))
        result = probe_once(params(url=srv.url, api_key="s3cret", admin_api_key="adm1n", tier="device"))
        flushes = [path for method, path in srv.state.requests if path == "/flush_cache"]
    assert result["warm"]["device"]["median_cached_tokens"] == 511
    assert flushes, "the probe never flushed the cache"


def test_stream_cut_midway(params):
    with FakeServer(faults=("gen_cut",)) as srv:
        p = params(url=srv.url, cold_output_len=8)
        with pytest.raises(ProbeError, match=r"was cut after 1 events.*closed the connection mid-way"):
            probe_once(p)


def test_no_cached_token_accounting_names_the_flag(params):
    with FakeServer(faults=("no_accounting",), cache_report=False) as srv:
        p = params(url=srv.url)
        with pytest.raises(ProbeError) as err:
            probe_once(p)
    msg = str(err.value)
    assert "no meta_info.cached_tokens" in msg
    assert "--enable-cache-report" in msg
    assert "enable_cache_report is false" in msg


def test_input_len_over_server_limit(params):
    with FakeServer() as srv:
        p = params(url=srv.url, input_len=200000)
        with pytest.raises(ProbeError, match="exceeds the server's max_req_input_len 131072"):
            probe_once(p)
        assert not any(path == "/generate" for _, path in srv.requests)


def test_ttft_is_shorter_for_a_hit(params):
    # ratios, not absolute times: a cold miss sleeps for every token, a hit for almost none
    with FakeServer(capacity=5000, s_per_token=0.0002) as srv:
        result = probe_once(params(url=srv.url, input_len=2000, tier="device", repeats=3))
    assert result["warm"]["device"]["warm_cold_ratio"] < 0.5
    assert len(result["cold"]["ttfts_ms"]) == 3


# ---- through Ansible ---------------------------------------------------------------------------


def test_ansible_check_mode_sends_nothing(ansible_run):
    with FakeServer() as srv:
        result = ansible_run({"url": srv.url, "input_len": 512, "repeats": 2}, check=True)
        assert srv.requests == []
    assert not result.get("failed"), result
    assert result["requests_sent"] == 0
    assert "nothing sent" in result["msg"]
    assert any("POST /flush_cache" in s for s in result["plan"]["steps"])


def test_ansible_failures_are_sentences_not_tracebacks(ansible_run):
    result = ansible_run({"url": f"http://127.0.0.1:{free_port()}", "ready_timeout": 0.5})
    assert result.get("failed") is True
    assert "connection refused" in result["msg"]
    assert "Traceback" not in json.dumps(result)
    bad = ansible_run({"max_warm_cold_ratio": 0, "min_cached_fraction": 1.5})
    assert bad.get("failed") is True
    assert "max_warm_cold_ratio must be greater than 0" in bad["msg"]
    assert "min_cached_fraction must be between 0 and 1" in bad["msg"]


def test_ansible_gate_false_measures_only(ansible_run):
    with FakeServer(capacity=1200, hicache=False) as srv:
        result = ansible_run({"url": srv.url, "input_len": 1000, "cold_output_len": 2, "warm_output_len": 2,
                              "repeats": 1, "tier": "host", "gate": False})
    assert not result.get("failed"), result["msg"]
    assert result["gate"]["enabled"] is False
    assert result["gate"]["passed"] is False
    assert "checks (gate off)" in result["msg"]
