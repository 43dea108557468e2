"""Issue 25 item 3: preflight refuses a HiCache host pool that cannot hold the probe's prefix plus the
filler its host tier pushes through it (one device pool; module_utils/sglang_probe_measure.py
filler_lengths), before any change. The demo inventory's config passes; a too-small --hicache-size is
refused, naming the variables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
pf = load("roles/preflight/filter_plugins/preflight.py", "preflight_filters")
sc = load("roles/sglang_service/filter_plugins/sglang_service_checks.py", "sglang_service_checks")
host_tokens = load("module_utils/sglang_pool_plan.py", "sglang_pool_plan").host_tokens
TABLE = json.loads((ROOT / "roles/sglang_service/files/sglang-flags.json").read_text())
DEMO = yaml.safe_load((ROOT / "inventories/demo/group_vars/sglang_hosts/demo.yml").read_text())


def _plan(hicache_args):
    args = {"--model-path": "/m", "--tp-size": 2, "--context-length": 196608, "--port": 30004,
            "--host": "127.0.0.1", **hicache_args}
    entry = {"name": "main", "unit": "sglang-main.service", "port": 30004, "bind": "127.0.0.1",
             "profile": "seed-validated", "profile_known": True, "profile_hicache_flags": [], "hicache": True,
             "api_key_set": False, "args": args}
    entry["argv"] = [str(w) for k, v in args.items() for w in ([k] if v is True else [k, v])]
    return entry


def _settings(**probe):
    base = {"rollout_probe_input_len_canary": DEMO["rollout_probe_input_len_canary"],
            "rollout_probe_input_len": DEMO["rollout_probe_input_len"], "output_len": 512,
            "device_tokens": DEMO["preflight_probe_device_tokens"],
            "kv_bytes_per_token": DEMO["preflight_kv_bytes_per_token"],
            "mamba_device_bytes": DEMO["preflight_mamba_device_bytes"]}
    base.update(probe)
    return {"profiles": ["seed-validated"], "draft_free_algorithms": [], "environment": {}, "gpus": None,
            "probe": base}


def test_the_demo_config_passes():
    plan = [_plan(DEMO["sglang_service_hicache_args"])]
    assert sc.config_findings(plan, [], TABLE, _settings()) == []
    assert pf.probe_findings(plan, _settings()["probe"]) == []


def test_a_too_small_hicache_size_is_refused_naming_the_variables():
    args = {**DEMO["sglang_service_hicache_args"], "--hicache-size": 6}
    # The service's own checks pass it (the pool is the rollout's probe's concern): preflight refuses it.
    assert sc.config_findings([_plan(args)], [], TABLE, _settings()) == []
    found = pf.probe_findings([_plan(args)], _settings()["probe"])
    assert len(found) == 2  # the canary's 48K and the 32K probe: 6 GB hold 131,046 KV tokens (KV share 0.7157)
    canary = found[0]
    assert "holds 131046 tokens per rank" in canary
    assert "needs 207692: rollout_probe_input_len_canary 48000 + 159692 filler tokens" in canary
    assert "preflight_probe_device_tokens 159692" in canary
    assert "preflight_kv_bytes_per_token 32768" in canary
    assert "preflight_mamba_device_bytes 2078834688" in canary
    assert "Raise '--hicache-size' in sglang_service_hicache_args or lower rollout_probe_input_len_canary" in canary
    assert "rollout_probe_input_len 32000 + 159692" in found[1]


def test_the_old_demo_probe_lengths_are_refused_with_the_exact_split():
    """8 GB hold 174,728 KV tokens of the hybrid, not 244,141: the old 64K canary (223,692) and 32K probe
    (191,692) do not fit; counted all to KV (mamba_device_bytes 0) they did."""
    old = _settings(rollout_probe_input_len_canary=64000, rollout_probe_input_len=32000)
    eight = {**DEMO["sglang_service_hicache_args"], "--hicache-size": 8}
    found = pf.probe_pool_findings([_plan(eight)], old["probe"])
    assert len(found) == 2
    assert "holds 174728 tokens per rank" in found[0]
    assert "rollout_probe_input_len_canary 64000" in found[0]
    dense = _settings(rollout_probe_input_len_canary=64000, rollout_probe_input_len=32000, mamba_device_bytes=0)
    assert pf.probe_pool_findings([_plan(eight)], dense["probe"]) == []
    # The demo's 10 GB hold 218,409 KV tokens: its lengths use the room above one device pool of
    # filler, 218,409 - 159,692 = 58,717 tokens.
    assert DEMO["sglang_service_hicache_args"]["--hicache-size"] == 10
    assert DEMO["rollout_probe_input_len_canary"] <= 58717
    assert DEMO["rollout_probe_input_len"] <= 58717


def test_the_demo_mamba_bytes_are_what_the_pool_plan_computes():
    """preflight_mamba_device_bytes in the demo inventory against module_utils/sglang_pool_plan.py
    mamba_device_bytes for the fixture model (sim/sglang_sim/fixture_model.py seed-27b) launched with the
    seed-validated profile (roles/sglang_service/defaults/main.yml), and preflight's split against the
    pool plan's expected_host_range (one arithmetic, two copies)."""
    import sys

    sys.path.insert(0, str(ROOT / "sim"))
    from sglang_sim.fixture_model import PROFILES

    plan = load("module_utils/sglang_pool_plan.py", "sglang_pool_plan_preflight_check")
    profile = yaml.safe_load((ROOT / "roles/sglang_service/defaults/main.yml").read_text())[
        "sglang_service_profiles"]["seed-validated"]
    fields = {flag.lstrip("-").replace("-", "_"): value for flag, value in profile.items()}
    assert fields["max_mamba_cache_size"] == 20
    assert fields["speculative_num_draft_tokens"] == 8
    device = DEMO["preflight_probe_device_tokens"]
    low, high, _ = plan.mamba_device_bytes(PROFILES["seed-27b"], fields, device)
    assert low == high == DEMO["preflight_mamba_device_bytes"]
    size = DEMO["sglang_service_hicache_args"]["--hicache-size"]
    expected = plan.expected_host_range(PROFILES["seed-27b"], 2, device, 1, size, 2.0, mamba_device_bytes=low)
    assert pf.probe_host_pool_tokens(DEMO["sglang_service_hicache_args"], 32768, device, low) == expected[0]


def test_ratio_pools_and_the_rule_switched_off():
    ratio = {"--enable-hierarchical-cache": True, "--hicache-ratio": "1.2"}
    found = pf.probe_pool_findings([_plan(ratio)], _settings(rollout_probe_input_len_canary=64000)["probe"])
    assert "holds 191631 tokens per rank" in found[0]  # int(159692 x 1.2) + 1: no split with a ratio
    assert "preflight_mamba_device_bytes" not in found[0]
    assert pf.probe_pool_findings([_plan(ratio)], _settings(device_tokens=0)["probe"]) == []
    assert pf.probe_pool_findings([_plan(ratio)], _settings(kv_bytes_per_token=0)["probe"]) == []
    off = _plan({"--hicache-size": 1})
    off["hicache"] = False
    assert pf.probe_pool_findings([off], _settings()["probe"]) == []


POOLS = [({"--hicache-size": 8}, 1), ({"--hicache-size": 3, "--page-size": 64}, 64),
         ({"--hicache-ratio": "2.0"}, 1), ({"--hicache-ratio": "1.5", "--page-size": 16}, 16)]


@pytest.mark.parametrize(("args", "page"), POOLS)
def test_preflight_sizes_the_pool_as_the_pool_plan_does(args, page):
    """One arithmetic: preflight's copy against module_utils/sglang_pool_plan.py host_tokens."""
    ratio = float(args["--hicache-ratio"]) if "--hicache-ratio" in args else None
    assert pf.probe_host_pool_tokens(args, 32768, 159692) == host_tokens(
        32768, 159692, page, args.get("--hicache-size", 0), ratio)


def test_the_service_task_passes_both_variables():
    task = (ROOT / "roles/preflight/tasks/rollout.yml").read_text()
    assert 'device_tokens: "{{ preflight_probe_device_tokens }}"' in task
    assert 'kv_bytes_per_token: "{{ preflight_kv_bytes_per_token }}"' in task
    assert 'mamba_device_bytes: "{{ preflight_mamba_device_bytes }}"' in task
