"""plan_candidates, host_class, progress_line and resume_state (module_utils/sglang_sizing.py)."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.sglang_pool_plan import host_tokens, kv_share
from ansible.module_utils.sglang_sizing import (
    DEFAULT_SIZES_GB,
    SizingError,
    host_class,
    plan_candidates,
    progress_line,
    resume_state,
    resume_summary,
)

GiB = 1024**3


def base(**over):
    inp = {
        "sizes_gb": [8, 16, 28],
        "mem_fractions": [0.80, 0.85],
        "tp": 2,
        "mem_total_bytes": 64 * GiB,
        "mem_available_bytes": 60 * GiB,
        "reserve_bytes": 4 * 10**9,
    }
    inp.update(over)
    return inp


def by_id(cands):
    return {c["id"]: c for c in cands}


def test_ids_pools_and_statuses():
    cands = by_id(plan_candidates(base()))
    assert sorted(cands) == ["s16-f0.80", "s16-f0.85", "s28-f0.80", "s28-f0.85", "s8-f0.80", "s8-f0.85"]
    assert cands["s16-f0.80"]["host_pool_bytes"] == 32 * 10**9
    assert cands["s16-f0.80"]["status"] == "planned"
    assert cands["s16-f0.80"]["reason"] == ""
    # 28 GB per rank > (60 GiB - 10 GiB) / 2 = 26.8 GB per rank: SGLang refuses it (the toolkit's rule,
    # 56 + 4 GB within 68.7 GB, would not).
    s28 = cands["s28-f0.80"]
    assert s28["status"] == "pruned"
    assert s28["reason"] == (
        "SGLang's admission rule: 2 x 28 GB = 56.0 GB pinned, but SGLang admits (MemAvailable 64.4 GB - its "
        "10 GiB reserve) / 2 ranks = 26.8 GB per rank"
    )


def test_sglang_rule_boundary_per_rank():
    # budget per rank = (available - 10 GiB) // tp; exactly 16 GB per rank fits, one byte less does not.
    avail = 10 * GiB + 2 * 16 * 10**9
    fits = by_id(plan_candidates(base(sizes_gb=[16], mem_fractions=[0.8], mem_available_bytes=avail)))
    assert fits["s16-f0.80"]["status"] == "planned"
    tight = by_id(plan_candidates(base(sizes_gb=[16], mem_fractions=[0.8], mem_available_bytes=avail - 2)))
    assert tight["s16-f0.80"]["status"] == "pruned"
    assert "SGLang's admission rule" in tight["s16-f0.80"]["reason"]


def test_sglang_rule_counts_the_padding_page():
    # A dense model's pool is whole tokens plus one padding token (page 1): 16e9 // 32768 + 1 tokens of
    # 32,768 B request 16,000,002,048 B per rank, just over the 16 GB the budget above holds.
    avail = 10 * GiB + 2 * 16 * 10**9
    cand = plan_candidates(base(sizes_gb=[16], mem_fractions=[0.8], mem_available_bytes=avail,
                                kv_bytes_per_token=32768))[0]
    assert cand["host_tokens"] == 16 * 10**9 // 32768 + 1
    assert cand["status"] == "pruned"
    assert "SGLang's admission rule" in cand["reason"]
    roomy = plan_candidates(base(sizes_gb=[16], mem_fractions=[0.8], mem_available_bytes=avail + 2 * 32768,
                                 kv_bytes_per_token=32768))[0]
    assert roomy["status"] == "planned"


def test_toolkit_reserve_rule_names_the_figures():
    # Plenty available for SGLang, but pools + reserve exceed MemTotal (preflight's ram_findings rule).
    inp = base(sizes_gb=[30, 31], mem_fractions=[0.8], mem_total_bytes=64 * 10**9, mem_available_bytes=200 * GiB)
    cands = by_id(plan_candidates(inp))
    assert cands["s30-f0.80"]["status"] == "planned"  # 60 + 4 <= 64: fits exactly
    s31 = cands["s31-f0.80"]
    assert s31["status"] == "pruned"
    assert s31["reason"] == (
        "the toolkit's RAM reserve: 62.0 GB pinned + sglang_service_memory_reserve_gb 4.0 GB > MemTotal 64.0 GB"
    )


def test_default_ladder_when_sizes_empty():
    cands = plan_candidates(base(sizes_gb=[], mem_fractions=[0.8], mem_available_bytes=10**13, mem_total_bytes=10**13))
    assert [c["size_gb"] for c in cands] == list(DEFAULT_SIZES_GB)


def test_device_tokens_predicted_from_mem_fraction():
    # The demo's measurement: +0.05 -> +39,322 tokens = 0.05 x 24 GiB / 32,768 B.
    inp = base(sizes_gb=[8], mem_fractions=[0.80, 0.85], device_tokens_now=159692, mem_fraction_now=0.80,
               gpu_bytes_per_rank=24 * GiB, kv_bytes_per_token=32768)
    cands = by_id(plan_candidates(inp))
    assert cands["s8-f0.80"]["device_tokens"] == 159692
    assert cands["s8-f0.85"]["device_tokens"] == 159692 + 39322
    assert cands["s8-f0.80"]["host_tokens"] == host_tokens(32768, 159692, 1, 8)


def test_hybrid_host_tokens_use_the_pool_plan_split():
    inp = base(sizes_gb=[8], mem_fractions=[0.80], device_tokens_now=159692, mem_fraction_now=0.80,
               gpu_bytes_per_rank=24 * GiB, kv_bytes_per_token=32768, mamba_device_bytes=2 * 10**9)
    cand = plan_candidates(inp)[0]
    share = kv_share((159692 + 1) * 32768, 2 * 10**9)
    assert share < 1
    assert cand["host_tokens"] == host_tokens(32768, 159692, 1, 8, kv_share=share)
    assert cand["host_tokens"] < host_tokens(32768, 159692, 1, 8)


def test_bound_keeps_a_spread():
    inp = base(sizes_gb=[4, 8, 12, 16, 20], mem_fractions=[0.8], mem_available_bytes=10**12,
               mem_total_bytes=10**12, max_candidates=3)
    cands = plan_candidates(inp)
    planned = [c["id"] for c in cands if c["status"] == "planned"]
    assert planned == ["s4-f0.80", "s12-f0.80", "s20-f0.80"]
    over = [c for c in cands if c["status"] == "pruned"]
    assert [c["id"] for c in over] == ["s8-f0.80", "s16-f0.80"]
    assert all(c["reason"].startswith("over the bound: max_candidates = 3") for c in over)


@pytest.mark.parametrize(("key", "value"), [
    ("sizes_gb", [0.5]), ("mem_fractions", []), ("mem_fractions", [1.2]), ("tp", 0),
    ("mem_total_bytes", None), ("max_candidates", 0),
])
def test_bad_input_names_the_key(key, value):
    with pytest.raises(SizingError, match=key):
        plan_candidates(base(**{key: value}))


@pytest.mark.parametrize(("facts", "name"), [
    ({"mem_total_mb": 64216, "gpu_model": "gfx1100", "gpu_count": 2}, "ram64g_gfx1100x2"),  # 64 GiB, firmware's cut
    ({"mem_total_mb": 48000, "gpu_model": "gfx1100", "gpu_count": 1}, "ram48g_gfx1100x1"),
    ({"mem_total_mb": 257000, "gpu_model": "GFX1100", "gpu_count": 4}, "ram256g_gfx1100x4"),
    ({"mem_total_mb": 80 * 1024, "gpu_model": "gfx1100", "gpu_count": 2}, "ram80g_gfx1100x2"),  # no bucket: 8 GiB
    ({"mem_total_mb": 25600, "gpu_model": None, "gpu_count": 0}, "ram24g_nogpu"),
])
def test_host_class(facts, name):
    assert host_class(facts) == name


def test_host_class_bad_input():
    with pytest.raises(SizingError, match="gpu_model"):
        host_class({"mem_total_mb": 64000, "gpu_model": "", "gpu_count": 2})
    with pytest.raises(SizingError, match="mem_total_mb"):
        host_class({"gpu_model": "gfx1100", "gpu_count": 2})


def test_progress_line_estimate():
    line = progress_line(3, 8, [40, 42, 50], None, "s16-f0.80", "ok")
    assert line == "candidate 3/8 s16-f0.80 ok in 50 s; about 3 min 30 s left (median 42 s x 5)"


def test_progress_line_bound_and_end():
    line = progress_line(2, 6, [100, 100], 600, "s8-f0.80", "failed_start")
    assert "about 6 min 40 s left" in line
    assert "the 10 min bound stops the sweep after about 4 more (6 min 40 s left of it)" not in line
    line = progress_line(2, 6, [200, 200], 600, "s8-f0.80", "ok")
    assert line.endswith("the 10 min bound stops the sweep after about 1 more (3 min 20 s left of it)")
    over = progress_line(2, 6, [400, 400], 600)
    assert "after about 0 more (0 s left of it)" in over
    assert "-" not in over.replace("s8-f", "")
    assert progress_line(6, 6, [60] * 6, 600).endswith("sweep done in 6 min")
    assert progress_line(0, 6, [], 600) == "candidate 0/6; 6 left, no estimate yet"


def test_resume_state(tmp_path):
    plan = {"release_id": "rel-b", "candidates": [
        {"id": "s8-f0.80", "status": "planned"}, {"id": "s16-f0.80", "status": "planned"},
        {"id": "s24-f0.80", "status": "pruned"},
    ]}
    results = tmp_path / "results"
    results.mkdir()
    (results / "s8-f0.80.json").write_text(json.dumps({"id": "s8-f0.80", "release_id": "rel-b", "status": "ok"}))
    (results / "s16-f0.80.json").write_text(json.dumps({"id": "s16-f0.80", "release_id": "rel-a", "status": "ok"}))
    (results / "s24-f0.80.json").write_text(json.dumps({"id": "s24-f0.80", "release_id": "rel-b"}))
    (results / "broken.json").write_text('{"id": "s8')
    notes: list[str] = []
    done, todo = resume_state(str(results), plan, notes)
    assert done == ["s8-f0.80"]
    assert [c["id"] for c in todo] == ["s16-f0.80"]
    assert any("measured on release 'rel-a', not this sweep's 'rel-b'" in n for n in notes)
    assert any("'s24-f0.80' is not planned" in n for n in notes)
    assert any(n.startswith("broken.json: not a readable result") for n in notes)
    assert resume_summary(str(tmp_path / "absent"), plan)["todo"] == plan["candidates"][:2]
