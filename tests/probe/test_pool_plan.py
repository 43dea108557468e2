"""The plan's pool arithmetic (module_utils/sglang_pool_plan.py) against SGLang 0.5.23's own formulas.

Each expected figure is worked out here the way the pinned wheel does it (site-packages/sglang/srt/):
- configs/model_config.py ModelConfig.get_num_kv_heads: max(1, total_kv_heads // tp)
- mem_cache/pool_host/mha.py MHATokenToKVPoolHost.get_size_per_token:
  (head_dim + v_head_dim) * head_num * layer_num * dtype.itemsize
- mem_cache/pool_host/base.py HostKVCache.__init__: int(host_size * 1e9 // size_per_token) or
  int(device_capacity_tokens * ratio), then (size // page + 1) * page
- mem_cache/hybrid_cache/hybrid_pool_assembler.py _split_hicache_size: GB x kv_bytes / (kv_bytes + mamba_bytes)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ansible.module_utils.sglang_pool_plan import (
    PoolPlanError,
    compare,
    expected_host_range,
    full_attention_layers,
    host_tokens,
    is_hybrid,
    kv_bytes_per_token,
    kv_share,
    mamba_device_bytes,
    probe_host_pool_findings,
    server_pools,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sim"))
from sglang_sim.fixture_model import PROFILES

SEED = PROFILES["seed-27b"]
TINY = PROFILES["tiny"]
# A dense Llama-3-8B-like config: 32 layers, 8 KV heads of 128 (head_dim from hidden / heads), bf16.
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}


def test_dense_kv_bytes_per_token_per_rank():
    # (128 + 128) * (8 // 2) * 32 * 2 = 65,536 B at TP=2; at TP=16 the heads stay at max(1, 8 // 16) = 1.
    assert kv_bytes_per_token(LLAMA, 2) == (128 + 128) * 4 * 32 * 2 == 65536
    assert kv_bytes_per_token(LLAMA, 1) == 131072
    assert kv_bytes_per_token(LLAMA, 16) == (128 + 128) * 1 * 32 * 2
    assert kv_bytes_per_token(LLAMA, 2, elem_bytes=1.0) == 32768  # --kv-cache-dtype fp8_e4m3
    assert not is_hybrid(LLAMA)


def test_hybrid_counts_only_full_attention_layers():
    # seed-27b: 64 layers, every 4th full attention -> 16; 4 KV heads of 256, TP=2 -> 2 per rank, bf16.
    assert full_attention_layers(SEED) == 16
    assert is_hybrid(SEED)
    assert kv_bytes_per_token(SEED, 2) == (256 + 256) * 2 * 16 * 2 == 32768  # sim/README.md's figure
    interval_only = {k: v for k, v in SEED.items() if k != "layer_types"}
    assert kv_bytes_per_token(interval_only, 2) == 32768
    nested = {"architectures": ["X"], "text_config": dict(SEED)}
    assert kv_bytes_per_token(nested, 2) == 32768


def test_no_attention_layers_is_refused():
    with pytest.raises(PoolPlanError, match="KV bytes per token"):
        kv_bytes_per_token({"num_hidden_layers": 0}, 2)


def test_host_tokens_by_size_and_by_ratio():
    # --hicache-size 12 at 32,768 B: int(12e9 // 32768) = 366,210, + 1 padding page (page 1) = 366,211.
    assert host_tokens(32768, 159692, 1, hicache_size_gb=12) == int(12 * 1e9 // 32768) + 1 == 366211
    # page 64: (366,210 // 64 + 1) * 64
    assert host_tokens(32768, 159692, 64, hicache_size_gb=12) == (366210 // 64 + 1) * 64
    # ratio: int(159,692 * 2.0) = 319,384 + 1; default 2.0; buffer_only 1.2
    assert host_tokens(32768, 159692, 1, hicache_ratio=2.0) == 319385
    assert host_tokens(32768, 159692, 1) == 319385
    assert host_tokens(32768, 159692, 1, host_memory_mode="buffer_only") == int(159692 * 1.2) + 1
    # --hicache-size wins over --hicache-ratio (base.py: host_size > 0 first)
    assert host_tokens(32768, 159692, 1, hicache_size_gb=8, hicache_ratio=2.0) == int(8e9 // 32768) + 1


def test_hybrid_split_of_hicache_size():
    # _split_hicache_size: KV pool 159,692 x 32,768 B; a Mamba device pool of 1 GB takes its share.
    kv_bytes = (159692 + 1) * 32768  # MHATokenToKVPool.get_kv_size_bytes: size + page_size rows
    share = kv_share(kv_bytes, 1e9)
    assert share == pytest.approx(kv_bytes / (kv_bytes + 1e9))
    low, high, how = expected_host_range(SEED, 2, 159692, 1, hicache_size_gb=12, mamba_device_bytes=1e9)
    assert low == high == int(12 * share * 1e9 // 32768) + 1
    assert "KV share" in how
    # Mamba bytes unknown: only the upper bound (all GB to KV) is known.
    low, high, how = expected_host_range(SEED, 2, 159692, 1, hicache_size_gb=12)
    assert (low, high) == (1, 366211)
    assert "upper bound" in how
    # ratio: exact, the KV device tokens x ratio, split or not.
    assert expected_host_range(SEED, 2, 159692, 1, hicache_ratio=2.0)[:2] == (319385, 319385)
    # dense: exact with the size.
    assert expected_host_range(LLAMA, 2, 100000, 1, hicache_size_gb=8)[:2] == (int(8e9 // 65536) + 1,) * 2


def test_compare_names_both_figures():
    assert compare("host pool", 366211, 366211, 366211, 0.02, "x") == []
    assert compare("host pool", 366211 * 0.99, 366211, 366211, 0.02, "x") == []
    assert compare("host pool", None, 366211, 366211, 0.02, "x") == []
    (failure,) = compare("host pool", 183105, 366211, 366211, 0.02, "--hicache-size 12 GB")
    assert "183105" in failure
    assert "366211" in failure
    assert "--hicache-size 12 GB" in failure
    (failure,) = compare("host pool", 400000, 1, 366211, 0.0, "upper")
    assert "1..366211" in failure
    assert "400000" in failure


def test_probe_needs_prefix_plus_fillers():
    lengths = {"rollout_probe_input_len_canary": 64000, "rollout_probe_input_len": 32000}
    # 8 GB all to KV (a dense model) at 32,768 B -> 244,141 tokens; fillers 159,692 + 64,000 = 223,692 fit.
    assert probe_host_pool_findings(host_tokens(32768, 159692, 1, 8), 159692, 1.0, lengths, "u") == []
    # 6 GB -> 183,106: the canary's 223,692 does not fit, the 32K probe (191,692) neither.
    found = probe_host_pool_findings(host_tokens(32768, 159692, 1, 6), 159692, 1.0, lengths, "u")
    assert len(found) == 2
    assert "rollout_probe_input_len_canary 64000" in found[0]
    assert "223692" in found[0]
    assert "183106" in found[0]
    assert "--hicache-size" in found[0]


# The seed profile's launch (roles/sglang_service/defaults/main.yml seed-validated) as ServerArgs fields.
SEED_ARGS = {"tp_size": 2, "max_mamba_cache_size": 20, "mamba_ssm_dtype": "bfloat16", "max_running_requests": 3,
             "speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8}
# Per GDN layer and slot at TP 2 (configs/qwen3_5.py mamba2_cache_params -> mamba_utils.py
# Mamba2StateShape.create): conv (128 x 48 + 2 x 16 x 128) / 2 = 5,120 x (4 - 1) in bf16 = 30,720 B;
# SSM (48 / 2) x 128 x 128 in --mamba-ssm-dtype bf16 = 786,432 B.
PER_SLOT = 5120 * 3 * 2 + 24 * 128 * 128 * 2
# memory_pool.py MambaPool: 48 GDN layers x (20 + 1 padding) slots; the DFLASH verify scratch
# (intermediate_ssm + intermediate_conv_window): 48 x (max_num_reqs 3 + 1) x 8 draft tokens.
SEED_MAMBA = 48 * 21 * PER_SLOT + 48 * 4 * 8 * PER_SLOT
DEMO_HOST = 174728  # int(8e9 x KV share // 32,768) + 1, KV share = 159,693 x 32,768 / (that + SEED_MAMBA)


def test_mamba_device_pool_of_the_seed_config():
    assert PER_SLOT == 817152
    low, high, how = mamba_device_bytes(SEED, SEED_ARGS, 159692)
    assert low == high == SEED_MAMBA == 2078834688
    assert "48 GDN layers x (20 + 1) slots" in how
    assert "8 draft tokens" in how
    # Without speculative decoding only the state slots; float32 SSM state (the default) doubles it.
    plain = {k: v for k, v in SEED_ARGS.items() if not k.startswith("speculative")}
    assert mamba_device_bytes(SEED, plain)[:2] == (48 * 21 * PER_SLOT,) * 2
    fp32 = {**plain, "mamba_ssm_dtype": None}
    assert mamba_device_bytes(SEED, fp32)[0] == 48 * 21 * (5120 * 3 * 2 + 24 * 128 * 128 * 4)
    # max_num_reqs capped by the Mamba slots (resolve_max_num_reqs: 20 // ratio, ratio 2..5): a range.
    many = {**SEED_ARGS, "max_running_requests": 64}
    low, high, how = mamba_device_bytes(SEED, many, 159692)
    assert (low, high) == (48 * 21 * PER_SLOT + 48 * 5 * 8 * PER_SLOT, 48 * 21 * PER_SLOT + 48 * 11 * 8 * PER_SLOT)
    # Not modelled: auto-sized pool, a dense model, ReplaySSM, DP attention.
    assert mamba_device_bytes(SEED, {**SEED_ARGS, "max_mamba_cache_size": None}) is None
    assert mamba_device_bytes(LLAMA, SEED_ARGS) is None
    assert mamba_device_bytes(SEED, {**SEED_ARGS, "enable_linear_replayssm_spec": True}) is None
    assert mamba_device_bytes(SEED, {**SEED_ARGS, "enable_dp_attention": True}) is None


def test_exact_host_pool_of_the_demo_and_seed_configs():
    low, high, how = expected_host_range(SEED, 2, 159692, 1, hicache_size_gb=8, mamba_device_bytes=SEED_MAMBA)
    kv = 159693 * 32768
    assert low == high == int(8 * kv / (kv + SEED_MAMBA) * 1e9 // 32768) + 1 == DEMO_HOST
    assert "KV share 0.7157" in how
    assert expected_host_range(SEED, 2, 159692, 1, hicache_size_gb=12, mamba_device_bytes=SEED_MAMBA)[:2] == (
        262091, 262091)


def _demo_info(**extra):
    info = {**SEED_ARGS, "enable_hierarchical_cache": True, "hicache_size": 8, "hicache_ratio": 2.0,
            "kv_cache_dtype": "bfloat16", "dtype": "bfloat16", "sglang_sim": {}, **extra}
    return info


@pytest.mark.parametrize("reported", [DEMO_HOST, DEMO_HOST // 2 + 1, 244141])
def test_the_gate_holds_the_demo_to_the_exact_figure(reported):
    """The pool_mismatch fault (half the host pool) and the old all-GB-to-KV figure fail; the exact one passes."""
    facts = {"enable_hierarchical_cache": True, "max_total_num_tokens": 159692, "page_size": 1}
    info = _demo_info(sglang_sim={"host_pool_tokens": reported})
    pools = server_pools(info, facts, None, SEED)
    assert pools["host_expected"] == [DEMO_HOST, DEMO_HOST]
    assert "mamba" in pools["host_expected_how"].lower()
    if reported == DEMO_HOST:
        assert pools["failures"] == []
    else:
        (failure,) = pools["failures"]
        assert f"reports {reported} tokens per rank, the plan expects {DEMO_HOST}" in failure
