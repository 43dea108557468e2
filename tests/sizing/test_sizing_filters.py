"""The filters of playbooks/hicache_sizing.yml: inputs named with their fix, the plan the playbook runs
(each candidate's flags and prefix bound), what a re-run keeps, and a probe result turned into a
candidate's figures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sizing_filters",
                                               REPO / "playbooks" / "filter_plugins" / "hicache_sizing.py")
f = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(f)

GOOD = {"sizes_gb": [8, 16], "mem_fractions": ["0.80"], "input_len": 32000, "repeats": 1, "max_prefixes": 40,
        "max_candidates": 8, "min_device_tokens": 32000, "max_total_s": 3600, "candidate_s": 600,
        "warm_margin": 0.25}
HOST = {"host": "h1", "release_id": "abc123", "tp": 2, "mem_total_bytes": 48_000_000_000,
        "mem_available_bytes": 48_000_000_000, "reserve_bytes": 4_000_000_000, "ram_source": "simulator",
        "mem_total_mb": 45776, "gpu_model": "simulated", "gpu_count": 2, "mem_fraction_now": "0.80",
        "device_tokens_now": 159692, "kv_bytes_per_token": 32768, "mamba_device_bytes": 2078834688,
        "hicache_args_now": {"--enable-hierarchical-cache": True, "--hicache-size": 10}}
SETTINGS = {"sizes_gb": [], "mem_fractions": [], "max_candidates": 8, "input_len": 32000, "max_prefixes": 40,
            "min_device_tokens": 32000, "warm_margin": 0.25, "max_total_s": 3600, "fleet": "demo"}


def test_good_inputs_have_no_finding():
    assert f.input_findings(GOOD) == []


@pytest.mark.parametrize(("key", "value", "variable"), [
    ("sizes_gb", [8, 0.5], "hicache_sizing_sizes_gb"),
    ("sizes_gb", "16", "hicache_sizing_sizes_gb"),
    ("mem_fractions", ["1.2"], "hicache_sizing_mem_fractions"),
    ("max_prefixes", 0, "hicache_sizing_max_prefixes"),
    ("candidate_s", "soon", "hicache_sizing_candidate_timeout_s"),
    ("warm_margin", -0.1, "hicache_sizing_warm_margin"),
    ("warm_slack_ms", -5, "hicache_sizing_warm_slack_ms"),
    ("warm_slack_ms", "soon", "hicache_sizing_warm_slack_ms"),
    ("warm_slack_ms", float("nan"), "hicache_sizing_warm_slack_ms"),
    ("warm_margin", float("inf"), "hicache_sizing_warm_margin"),
])
def test_a_bad_input_is_named_with_its_fix(key, value, variable):
    findings = f.input_findings({**GOOD, key: value})
    assert len(findings) == 1, findings
    assert findings[0].startswith(variable), findings


def test_argv_map_switches_values_and_lists():
    argv = ["--model-path", "/m", "--enable-metrics", "--cuda-graph-bs-decode", "1", "2", "--tp-size", "2"]
    assert f.argv_map(argv) == {"--model-path": "/m", "--enable-metrics": True, "--cuda-graph-bs-decode": ["1", "2"],
                                "--tp-size": "2"}


def test_the_plan_runs_each_candidate_with_its_flags_and_a_prefix_bound_from_the_pool():
    plan = f.plan(HOST, SETTINGS)
    planned = [c for c in plan["candidates"] if c["status"] == "planned"]
    pruned = [c for c in plan["candidates"] if c["status"] == "pruned"]
    # 48 GB, 2 ranks, SGLang's 10 GiB reserve: (48e9 - 10 GiB) / 2 = 18.6 GB per rank at most.
    assert [c["size_gb"] for c in planned] == [4, 8, 12, 16]
    assert all("SGLang's admission rule" in c["reason"] for c in pruned if c["size_gb"] <= 512)
    s16 = next(c for c in planned if c["size_gb"] == 16)
    # Each candidate runs without the L3 tier (a dropped flag): the sweep sizes the RAM tiers only.
    assert s16["args"] == {"--hicache-size": 16, "--mem-fraction-static": "0.80", "--hicache-storage-backend": None}
    # 16 GB x the KV share 0.7157 / 32,768 B = 349,455 host tokens: 10 prefixes of 32,000, + 2.
    assert s16["capacity_max_prefixes"] == 12
    # 4 GB: 87,364 host tokens, fewer than the GPU's 159,692: the fill passes the GPU pool (4 + 2).
    assert next(c for c in planned if c["size_gb"] == 4)["capacity_max_prefixes"] == 6
    assert plan["needs"] == {"min_device_tokens": 32000, "warm_margin": 0.25, "warm_slack_s": 0.0,
                             "reserve_bytes": 4_000_000_000}
    assert f.plan(HOST, {**SETTINGS, "warm_slack_ms": 50})["needs"]["warm_slack_s"] == 0.05
    assert plan["facts"] == {"mem_total_mb": 45776, "gpu_model": "simulated", "gpu_count": 2}


def test_the_prefix_bound_never_exceeds_the_setting():
    plan = f.plan({**HOST, "mem_total_bytes": 256_000_000_000, "mem_available_bytes": 256_000_000_000},
                  {**SETTINGS, "max_prefixes": 20})
    assert max(c["capacity_max_prefixes"] for c in plan["candidates"]) == 20


def test_a_release_without_a_mem_fraction_needs_the_candidates_given():
    with pytest.raises(Exception, match="hicache_sizing_mem_fractions"):  # AnsibleFilterError
        f.plan({**HOST, "mem_fraction_now": ""}, SETTINGS)


def test_resume_keeps_this_releases_results_and_the_router_state(tmp_path):
    plan = f.plan(HOST, SETTINGS)
    (tmp_path / "results").mkdir()
    (tmp_path / "plan.json").write_text(json.dumps({**plan, "router_was_in": True}))
    (tmp_path / "results" / "s8-f0.80.json").write_text(json.dumps({"id": "s8-f0.80", "release_id": "abc123",
                                                                     "elapsed_s": 12.5}))
    (tmp_path / "results" / "s4-f0.80.json").write_text(json.dumps({"id": "s4-f0.80", "release_id": "other"}))
    state = f.resume(str(tmp_path), plan)
    assert state["done"] == ["s8-f0.80"]
    assert [c["id"] for c in state["todo"]] == ["s4-f0.80", "s12-f0.80", "s16-f0.80"]
    assert state["elapsed_s"] == [12.5]
    assert state["router_was_in"] is True
    assert any("other" in line for line in state["ignored"])
    # A plan of another release says nothing about the router.
    assert f.resume(str(tmp_path), {**plan, "release_id": "new"})["router_was_in"] is None
    lines = f.plan_lines(plan, state)
    assert any(line.startswith("s8-f0.80") and "measured before" in line for line in lines)
    assert any(line.startswith("s16-f0.80") and "to measure (prefix fill bound 12)" in line for line in lines)


PROBE = {
    "server": {"version": "0.5.23", "max_total_num_tokens": 159692},
    "pools": {"device_tokens": 159692, "host_tokens": 349456},
    "cold": {"median_ttft_ms": 480.0}, "warm": {"device": {"median_ttft_ms": 6.0}, "host": {"median_ttft_ms": 9.5}},
    "parity": {"enabled": True, "tiers": {"device": {"status": "equal"}, "host": {"status": "equal"}}},
    "capacity": {"held": 10, "bound_reached": False, "prefix_len": 32000},
}


def test_probe_figures():
    cand = {"id": "s16-f0.80", "size_gb": 16}
    out = f.probe_figures(PROBE, cand, HOST, "123")
    assert out["status"] == "ok"
    assert (out["device_tokens"], out["host_tokens"], out["prefixes_held"]) == (159692, 349456, 10)
    assert (out["cold_ttft_s"], out["warm_device_ttft_s"], out["warm_host_ttft_s"]) == (0.48, 0.006, 0.0095)
    assert out["pinned_bytes"] == 32_000_000_000
    # On a simulator host what is left is its told RAM minus the pools; on a real one MemAvailable.
    assert out["ram_left_bytes"] == 16_000_000_000
    assert f.probe_figures(PROBE, cand, {**HOST, "ram_source": "meminfo"}, "123")["ram_left_bytes"] == 123
    assert out["parity_ok"] is True


@pytest.mark.parametrize("parity", [
    {"enabled": False, "tiers": {}},
    {"enabled": True, "tiers": {"device": {"status": "equal"}, "host": {"status": "diverged"}}},
    {"enabled": True, "tiers": {}},
])
def test_parity_ok_only_when_every_tier_was_equal(parity):
    assert f.probe_figures({**PROBE, "parity": parity}, {"size_gb": 16}, HOST, "0")["parity_ok"] is False


def test_a_failed_start_says_what_failed_and_what_sglang_said():
    message = ("sglang-main-sizing.service gave up waiting: the unit failed (after 1 of at most 31 health polls).\n"
               "Unit state: ActiveState=failed\n" + "journal line\n" * 40
               + "python[741]: RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
               + "systemd[1]: sglang-main-sizing.service: Main process exited, status=1/FAILURE\n")
    text = f.error_text(message)
    assert text.startswith("sglang-main-sizing.service gave up waiting")
    assert "RuntimeError: Not enough memory" in text
    assert len(text) <= 600
    assert f.error_text("") == "no detail"
