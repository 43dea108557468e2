"""The simulator fault pool_mismatch: a host pool of half the configured size, used and reported so."""

from __future__ import annotations

import random
import re

from simharness import SMALL_ENV, SMALL_HICACHE_ARGS

# SMALL_HICACHE_ARGS: D = 4096 device tokens, --hicache-ratio 2.0 -> 8192 (+1 padding page) normally.
HALF = 8192 // 2 + 1


def _host_total(sim) -> int:
    status, raw, _ = sim.request("GET", "/metrics")
    assert status == 200
    found = re.search(r"^sglang:hicache_host_total_tokens\{[^}]*\} (\d+)", raw.decode(), re.M)
    assert found, raw.decode()[:400]
    return int(found.group(1))


def test_pool_mismatch_reports_and_uses_half_the_host_pool(sim_factory):
    normal = sim_factory(SMALL_HICACHE_ARGS, SMALL_ENV)
    bad = sim_factory(SMALL_HICACHE_ARGS, {**SMALL_ENV, "SGLANG_SIM_FAULT": "pool_mismatch"})
    assert normal.get_json("/get_server_info")["sglang_sim"]["host_pool_tokens"] == 8193
    assert _host_total(normal) == 8193
    info = bad.get_json("/get_server_info")
    assert info["sglang_sim"]["host_pool_tokens"] == HALF
    assert info["hicache_ratio"] == 2.0  # the configuration still says 2.0 x D
    assert info["max_total_num_tokens"] == 4096  # the device pool is untouched
    assert _host_total(bad) == HALF
    assert f"Allocating HiCache host pool: {HALF} tokens per rank" in bad.log()
    # Used at that size: 2 x 3000 tokens written through fit the normal host pool, not the halved one.
    rng = random.Random(5)
    prompts = [[rng.randrange(248_320) for _ in range(3000)] for _ in range(2)]
    for sim in (normal, bad):
        for ids in prompts:
            sim.post_json("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
    assert normal.get_json("/get_server_info")["sglang_sim"]["host_used_tokens"] > HALF
    assert bad.get_json("/get_server_info")["sglang_sim"]["host_used_tokens"] <= HALF
