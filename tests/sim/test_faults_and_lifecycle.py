"""Faults the simulator plays, its startup/shutdown behaviour, and the timing model's ratios."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from simharness import SIM_DIR, SMALL_ENV, SMALL_HICACHE_ARGS, wait_healthy

SEED_HICACHE = ["--tp-size", "2", "--mem-fraction-static", "0.80", "--context-length", "196608",
                "--enable-hierarchical-cache", "--hicache-size", "12", "--hicache-ratio", "2.0",
                "--hicache-write-policy", "write_through", "--enable-cache-report"]


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(248_320) for _ in range(n)]


def _gen(sim, ids, max_new=1):
    return sim.post_json("/generate", {"input_ids": ids,
                                       "sampling_params": {"max_new_tokens": max_new}})


def test_usage_error_exits_2_like_argparse(model_dir):
    env = {**os.environ, "PYTHONPATH": str(SIM_DIR)}
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_sim.launch_server", "--model-path", str(model_dir),
         "--hicache-size", "0.5"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "error: argument --hicache-size: invalid int value: '0.5'" in proc.stderr


def test_health_is_503_while_loading_then_200(sim_factory):
    sim = sim_factory(SMALL_HICACHE_ARGS, {**SMALL_ENV, "SGLANG_SIM_LOAD_DELAY_S": "2"},
                      wait=False)
    deadline = time.monotonic() + 10
    seen_503 = False
    while time.monotonic() < deadline:
        try:
            status = sim.request("GET", "/health", timeout=2)[0]
        except OSError:
            time.sleep(0.02)
            continue
        if status == 503 and not seen_503:
            seen_503 = True  # the first answer comes early in the 2 s load: generate is refused
            assert sim.request("POST", "/generate", {"text": "x"})[0] == 503
        if status == 200:
            break
        time.sleep(0.05)
    assert seen_503
    assert status == 200
    log = sim.log()
    assert "max_total_num_tokens=4096" in log
    assert "The server is fired up and ready to roll!" in log
    assert "[sglang-sim]" in log


def test_sigterm_exits_cleanly(sim_factory):
    sim = sim_factory(SMALL_HICACHE_ARGS, SMALL_ENV)
    os.kill(sim.proc.pid, signal.SIGTERM)
    assert sim.proc.wait(timeout=10) == 0
    assert "SIGTERM" in sim.log()


def test_ignored_flags_are_logged_once(sim_factory):
    sim = sim_factory([*SMALL_HICACHE_ARGS, "--quantization", "gptq", "--cuda-graph-bs-decode",
                       "1", "2", "4", "--some-future-flag", "x"], SMALL_ENV)
    log = sim.log()
    ignored = [ln for ln in log.splitlines() if "does not model these SGLang flags" in ln]
    assert len(ignored) == 1
    assert "--quantization" in ignored[0]
    assert "--cuda-graph-bs-decode" in ignored[0]
    assert "--some-future-flag" in log


def test_fault_startup_exit(sim_factory):
    sim = sim_factory(SMALL_HICACHE_ARGS, {**SMALL_ENV, "SGLANG_SIM_FAULT": "startup_exit"},
                      wait=False)
    assert sim.proc.wait(timeout=15) == 1
    assert "Not enough host memory available" in sim.log()


def test_real_host_memory_check_fails_startup(sim_factory):
    sim = sim_factory(SEED_HICACHE, {"SGLANG_SIM_HOST_MEM_GB": "16"}, wait=False)
    assert sim.proc.wait(timeout=15) == 1
    assert "Not enough host memory available. Requesting 12.00 GB but only have 8.00 GB" in sim.log()


def test_fault_never_healthy(sim_factory):
    sim = sim_factory(SMALL_HICACHE_ARGS, {**SMALL_ENV, "SGLANG_SIM_FAULT": "never_healthy"},
                      wait=False)
    deadline = time.monotonic() + 10
    while "never_healthy" not in sim.log():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for _ in range(3):
        assert sim.request("GET", "/health")[0] == 503
        assert sim.request("GET", "/ready")[0] == 503
    assert sim.proc.poll() is None


def test_fault_generate_500(sim_factory):
    sim = sim_factory(SMALL_HICACHE_ARGS, {**SMALL_ENV, "SGLANG_SIM_FAULT": "generate_500"})
    status, raw, _ = sim.request("POST", "/generate", {"text": "hello"})
    assert status == 500
    assert "generate_500" in json.loads(raw)["error"]["message"]
    assert sim.request("POST", "/v1/completions", {"prompt": "hello"})[0] == 500
    assert sim.request("GET", "/health")[0] == 200


def test_fault_cut_stream(sim_factory):
    sim = sim_factory(SMALL_HICACHE_ARGS, {**SMALL_ENV, "SGLANG_SIM_FAULT": "cut_stream",
                                           "SGLANG_SIM_CUT_AFTER": "2"})
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=10)
    body = json.dumps({"text": "cut me " * 20, "stream": True,
                       "sampling_params": {"max_new_tokens": 10}})
    conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    with pytest.raises(http.client.IncompleteRead) as err:
        resp.read()
    partial = err.value.partial.decode()
    assert partial.count("data: ") == 2
    assert "[DONE]" not in partial
    conn.close()


def test_fault_ignore_host_tier(sim_factory):
    sim = sim_factory(SMALL_HICACHE_ARGS, {**SMALL_ENV, "SGLANG_SIM_FAULT": "ignore_host_tier"})
    info = sim.get_json("/get_server_info")
    assert info["enable_hierarchical_cache"] is True  # the flags are accepted...
    ids = _ids(1, 3000)
    _gen(sim, ids)
    _gen(sim, _ids(2, 3000))
    back = _gen(sim, ids)["meta_info"]
    assert back.get("cached_tokens_details", {}).get("host", 0) == 0  # ...the tier does nothing
    assert back["cached_tokens"] < 2999
    assert sim.get_json("/get_server_info")["sglang_sim"]["host_used_tokens"] == 0


def test_fault_slow_prefill_scales_the_modelled_prefill(sim_factory):
    normal = sim_factory(SMALL_HICACHE_ARGS, SMALL_ENV)
    slow = sim_factory(SMALL_HICACHE_ARGS, {**SMALL_ENV, "SGLANG_SIM_FAULT": "slow_prefill",
                                            "SGLANG_SIM_SLOW_FACTOR": "10"})
    ids = _ids(3, 2000)
    fast_s = _gen(normal, ids)["meta_info"]["sglang_sim"]["modelled_prefill_s"]
    slow_s = _gen(slow, ids)["meta_info"]["sglang_sim"]["modelled_prefill_s"]
    assert slow_s / fast_s == pytest.approx(10.0, rel=1e-6)


def test_fault_degrade_under_traffic_passes_a_probe_then_slows_live_traffic(sim_factory):
    """The first SGLANG_SIM_DEGRADE_AFTER requests are as fast as a healthy server's (a probe
    passes); every later one is slower, even a cached prompt."""
    sim = sim_factory(SMALL_HICACHE_ARGS, {**SMALL_ENV, "SGLANG_SIM_FAULT": "degrade_under_traffic",
                                           "SGLANG_SIM_DEGRADE_AFTER": "3", "SGLANG_SIM_SLOW_FACTOR": "10"})
    ids = _ids(5, 2000)
    cold = _gen(sim, ids)["meta_info"]["sglang_sim"]["modelled_prefill_s"]
    warm = _gen(sim, ids)["meta_info"]
    assert warm["cached_tokens"] >= 1999
    assert warm["sglang_sim"]["modelled_prefill_s"] < 0.01 * cold  # a device hit: about free
    _gen(sim, _ids(6, 2000))  # the third request
    late_cold = _gen(sim, _ids(7, 2000))["meta_info"]["sglang_sim"]["modelled_prefill_s"]
    late_warm = _gen(sim, ids)["meta_info"]
    assert late_cold == pytest.approx(10 * cold + 0.45 * cold, rel=1e-3)
    assert late_warm["cached_tokens"] >= 1999
    assert late_warm["sglang_sim"]["modelled_prefill_s"] > 0.4 * cold  # a cached prompt is slow too


def test_timing_model_matches_the_seed_at_128k(sim_factory):
    """Cold 128K ~ 192 s, device hit ~ free, host hit ~ 2.65 s (modelled), and the simulated
    wall-clock TTFTs keep the cold/host ordering with a wide margin."""
    scale = 0.005
    sim = sim_factory(SEED_HICACHE, {"SGLANG_SIM_TIME_SCALE": str(scale)})
    info = sim.get_json("/get_server_info")
    assert info["max_total_num_tokens"] == 159_692
    ids = _ids(42, 128_000)
    cold = _gen(sim, ids)["meta_info"]
    device = _gen(sim, ids)["meta_info"]
    for seed in (43, 44):  # fillers that push the whole prefix out of the device pool
        _gen(sim, _ids(seed, 100_000))
    host = _gen(sim, ids)["meta_info"]
    assert cold["cached_tokens"] == 0
    assert device["cached_tokens_details"] == {"device": 127_999, "host": 0}
    assert host["cached_tokens_details"]["host"] == 127_999
    assert host["cached_tokens"] == 127_999
    cold_s = cold["sglang_sim"]["modelled_prefill_s"]
    host_s = host["sglang_sim"]["modelled_prefill_s"]
    assert cold_s == pytest.approx(192.0, rel=0.01)
    assert host_s == pytest.approx(2.65, rel=0.05)
    assert device["sglang_sim"]["modelled_prefill_s"] < 0.01
    # Wall clock (scaled 0.005): ~0.96 s cold vs ~13 ms host. The TTFT runs from the request's
    # arrival, so it is never shorter than the scaled model (the simulator's own work on the
    # ~1 MB body is inside it, not added to it); beyond that only the ordering with a wide
    # margin is asserted, never an absolute speed.
    for case in (cold, device, host):
        assert case["sglang_sim"]["ttft_s"] >= case["sglang_sim"]["modelled_prefill_s"] * scale
    assert cold["sglang_sim"]["ttft_s"] > 5 * host["sglang_sim"]["ttft_s"]


def test_queueing_beyond_max_running_requests(sim_factory):
    import threading

    sim = sim_factory([*SMALL_HICACHE_ARGS[:-2], "--max-running-requests", "1"],
                      {**SMALL_ENV, "SGLANG_SIM_TIME_SCALE": "1.0",
                       "SGLANG_SIM_PREFILL_RATE": "1e9", "SGLANG_SIM_DECODE_RATE": "10"})
    results = []

    def one(seed):
        results.append(_gen(sim, _ids(seed, 50), max_new=4)["meta_info"]["sglang_sim"])

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert len(results) == 2
    queued = max(r["queue_s"] for r in results)
    assert queued > 0.1  # the second waited for the first's ~0.3 s decode
    wait_healthy(sim)
