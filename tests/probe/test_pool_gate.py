"""Issue 25 item 2: after healthy and before probing, the server's pools against the plan.

The expected host pool follows SGLang 0.5.23 (site-packages/sglang/srt/): mem_cache/pool_host/base.py
HostKVCache.__init__ and, for the hybrid seed-27b, mem_cache/hybrid_cache/hybrid_pool_assembler.py
_split_hicache_size with an auto-sized Mamba pool (mem_cache/kv_cache_configurator.py, budget
r / (1 + r), r = mamba_full_memory_ratio, fallback 0.9): the KV pool's share of --hicache-size is
between 1 / 1.9 and 1. The host pool's size is reported only in /metrics sglang:hicache_host_total_tokens
(observability/metrics_collector.py); the simulator also puts it in /get_server_info sglang_sim.
"""

from __future__ import annotations

import pytest
from ansible.module_utils.sglang_pool_plan import (
    hicache_cost,
    host_tokens_from_metrics,
    pool_gate_checks,
    server_pools,
)
from sim_server import HICACHE_ARGS, SEED_ARGS, sim_available

LLAMA = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8}
SEED_LOW = int(12e9 / 1.9 // 32768) + 1  # 192,743: the KV share of 12 GB with the Mamba pool at most 0.9 x KV
SEED_HIGH = int(12e9 // 32768) + 1  # 366,211: all 12 GB to the KV pool
SEED_HALF = int(12e9 // 32768) // 2 + 1  # 183,106: what pool_mismatch reports


def _facts(device=100000, hicache=True, model_path=None):
    return {"max_total_num_tokens": device, "page_size": 1, "enable_hierarchical_cache": hicache,
            "model_path": model_path}


def test_metrics_text_gives_the_host_pool():
    text = ('# HELP sglang:hicache_host_total_tokens Total capacity\n'
            'sglang:hicache_host_total_tokens{model_name="m",tp_rank="0"} 366211.0\n'
            'sglang:hicache_host_total_tokens{model_name="m",tp_rank="1"} 366211.0\n'
            'sglang:hicache_host_used_tokens{model_name="m"} 5.0\n')
    assert host_tokens_from_metrics(text) == 366211
    assert host_tokens_from_metrics("sglang:num_requests_running 1\n") is None
    assert host_tokens_from_metrics(None) is None


def test_dense_by_size_exact_and_mismatch_names_both_figures():
    info = {"tp_size": 2, "hicache_size": 8, "hicache_ratio": 2.0,
            "sglang_sim": {"host_pool_tokens": int(8e9 // 65536) + 1}}
    pools = server_pools(info, _facts(), None, LLAMA)
    assert pools["failures"] == []
    assert pools["host_expected"] == [122071, 122071]
    assert pools["host_source"].startswith("/get_server_info sglang_sim")
    info["sglang_sim"]["host_pool_tokens"] = 61036
    pools = server_pools(info, _facts(), None, LLAMA)
    (failure,) = pools["failures"]
    assert "61036" in failure
    assert "122071" in failure
    assert "--hicache-size 8 GB" in failure
    (check,) = pool_gate_checks({"pools": pools})
    assert check["passed"] is False
    assert check["reason"] == failure


def test_ratio_from_metrics_and_the_not_checked_notes():
    metrics = 'sglang:hicache_host_total_tokens{tp_rank="0"} 200001\n'
    info = {"tp_size": 1, "hicache_size": 0, "hicache_ratio": 2.0}
    pools = server_pools(info, _facts(device=100000), metrics, LLAMA)
    assert pools["host_tokens"] == 200001
    assert pools["failures"] == []
    assert server_pools(info, _facts(device=150000), metrics, LLAMA)["failures"]
    assert "--enable-metrics" in server_pools(info, _facts(), None, LLAMA)["note"]
    assert "config.json" in server_pools(info, _facts(), metrics, None)["note"]
    off = server_pools(info, _facts(hicache=False), metrics, LLAMA)
    assert off["note"] == "HiCache off: no host pool"
    assert pool_gate_checks({"pools": off}) == []


def test_hicache_cost_against_the_baseline():
    baseline = {"server": {"max_total_num_tokens": 233207, "enable_hierarchical_cache": False}}
    cost = hicache_cost({"device_tokens": 159692}, baseline)
    assert cost == {"baseline_device_tokens": 233207, "baseline_hicache": False, "device_tokens": 159692,
                    "change_pct": -31.5}
    assert hicache_cost({"device_tokens": 159692}, None) is None
    assert hicache_cost({"device_tokens": 159692}, {"cold": {}}) is None


@pytest.mark.skipif(not sim_available(), reason="the simulator (sim/sglang_sim) is not in this tree")
def test_pool_mismatch_fails_the_gate_before_probing(start_sim, ansible_run):
    sim = start_sim(SEED_ARGS + HICACHE_ARGS, SGLANG_SIM_FAULT="pool_mismatch")
    result = ansible_run({"url": sim.url, "input_len": 2000, "cold_output_len": 4, "repeats": 1,
                          "ready_timeout": 30, "request_timeout": 60, "flush_timeout": 10})
    assert result.get("failed") is True
    assert f"the server reports {SEED_HALF} tokens per rank" in result["msg"]
    assert f"the plan expects {SEED_LOW}..{SEED_HIGH}" in result["msg"]
    assert result["pools"]["device_tokens"] == 159692
    assert "cold" not in result  # nothing was probed
    assert "POST /generate" not in sim.log()


@pytest.mark.skipif(not sim_available(), reason="the simulator (sim/sglang_sim) is not in this tree")
def test_healthy_pools_pass_and_are_recorded_from_metrics(start_sim, ansible_run, tmp_path):
    sim = start_sim(SEED_ARGS + HICACHE_ARGS + ["--enable-metrics"])
    report = tmp_path / "probe.json"
    # The pools are under test, not the TTFT ratio: at this time scale a 2,000-token cold read takes
    # about 4 ms, the simulator's own overhead, and with two busy loops beside the test one warm read
    # measured 4.1 ms against 4.0 ms cold (1.02 > 0.9). The ratio's limit is 50, as in test_capacity.py.
    result = ansible_run({"url": sim.url, "input_len": 2000, "cold_output_len": 4, "repeats": 1, "tier": "device",
                          "ready_timeout": 30, "request_timeout": 60, "flush_timeout": 10,
                          "max_warm_cold_ratio": 50.0, "report_path": str(report),
                          "baseline": {"cold": {"median_ttft_ms": 1e6},
                                       "server": {"max_total_num_tokens": 233207}}})
    assert not result.get("failed"), result.get("msg")
    pools = result["pools"]
    assert pools["host_tokens"] == SEED_HIGH
    assert pools["host_source"] == "/metrics sglang:hicache_host_total_tokens"
    assert pools["host_expected"] == [SEED_LOW, SEED_HIGH]
    assert pools["hicache_cost"]["change_pct"] == -31.5
    assert '"change_pct": -31.5' in report.read_text()


@pytest.mark.skipif(not sim_available(), reason="the simulator (sim/sglang_sim) is not in this tree")
def test_a_bigger_device_pool_that_the_host_pool_cannot_back_fails_before_probing(start_sim, ansible_run):
    """--mem-fraction-static 0.80 -> 0.95 grows the device pool by 0.15 x 24 GiB / 32 KiB per token (the
    simulator's GPUs, the seed model's KV bytes per token per rank); a 7 GB host pool then cannot hold
    the prefix plus the fillers that push it out of that pool: the gate says so, naming the figures and
    the knobs, before any probe request (instead of a host tier that merely looks slow)."""
    args = [a if a != "0.80" else "0.95" for a in SEED_ARGS]
    hicache = [a if a != "12" else "7" for a in HICACHE_ARGS]
    sim = start_sim(args + hicache)
    result = ansible_run({"url": sim.url, "input_len": 2000, "cold_output_len": 4, "repeats": 1,
                          "ready_timeout": 30, "request_timeout": 60, "flush_timeout": 10})
    device = result["pools"]["device_tokens"]
    assert device - 159692 == pytest.approx(0.15 * 24 * 2**30 / 32768, abs=1)
    host = result["pools"]["host_tokens"]
    assert host == int(7e9 // 32768) + 1
    assert result.get("failed") is True
    assert (f"the host pool holds {host} tokens per rank, fewer than the probed prefix (2000 tokens) plus the "
            f"fillers that push it out of the device pool ({device} tokens") in result["msg"]
    assert "--mem-fraction-static" in result["msg"]
    assert "POST /generate" not in sim.log()
