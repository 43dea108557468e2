"""recommend and group_vars_text (module_utils/sglang_sizing.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.sglang_sizing import SizingError, group_vars_text, recommend

REPO = Path(__file__).resolve().parents[2]
NEEDS = {"min_device_tokens": 32000, "warm_margin": 0.25, "reserve_bytes": 4 * 10**9}


def result(cid, **over):
    size = int(cid.split("-")[0][1:])
    res = {
        "id": cid, "size_gb": size, "mem_fraction": float(cid.split("-f")[1]), "status": "ok", "error": "",
        "start_s": 30.0, "device_tokens": 159692, "host_tokens": size * 30000, "pinned_bytes": size * 2 * 10**9,
        "ram_left_bytes": 60 * 10**9 - size * 2 * 10**9, "ram_source": "meminfo", "cold_ttft_s": 1.9,
        "warm_device_ttft_s": 0.030, "warm_host_ttft_s": 0.040, "parity_ok": True, "prefixes_held": size // 2,
        "prefixes_bound_reached": False, "prefix_len": 32000, "elapsed_s": 60.0,
    }
    res.update(over)
    return res


def test_most_prefixes_wins_with_reasons():
    results = [
        result("s8-f0.80"), result("s16-f0.80", warm_host_ttft_s=0.041), result("s24-f0.80", warm_host_ttft_s=0.038),
    ]
    rec = recommend(results, NEEDS)
    assert rec["choice"] == "s24-f0.80"
    assert rec["reasons"]["s24-f0.80"] == (
        "chosen: holds 12 prefixes of 32,000 tokens, warm host TTFT 38 ms (best 38 ms), 48.0 GB pinned, "
        "12.0 GB left, 159,692 GPU KV tokens"
    )
    assert rec["reasons"]["s8-f0.80"].startswith("admissible, not chosen: holds 4 prefixes")
    assert rec["reasons"]["s8-f0.80"].endswith("(the choice s24-f0.80 holds 12)")
    assert rec["admissible"] == ["s24-f0.80", "s16-f0.80", "s8-f0.80"]


def test_each_exclusion_is_explained():
    results = [
        result("s8-f0.80"),
        result("s48-f0.80", status="failed_start", error="Not enough host memory available"),
        result("s32-f0.80", parity_ok=False),
        result("s16-f0.70", device_tokens=20000),
        result("s28-f0.80", ram_left_bytes=3 * 10**9),
        result("s24-f0.80", warm_host_ttft_s=0.076),
        result("s12-f0.80", warm_host_ttft_s=None),
    ]
    rec = recommend(results, NEEDS)
    reasons = rec["reasons"]
    assert rec["choice"] == "s8-f0.80"
    assert reasons["s48-f0.80"] == "excluded: failed_start (Not enough host memory available)"
    assert "parity failed" in reasons["s32-f0.80"]
    assert reasons["s16-f0.70"] == "excluded: 20000 GPU KV tokens, the profile needs 32,000 (min_device_tokens)"
    assert reasons["s28-f0.80"].startswith(
        "excluded: 3.0 GB RAM left with the server running, below the reserve 4.0 GB"
    )
    assert reasons["s24-f0.80"].startswith(
        "excluded: warm host TTFT 76 ms is 1.9x the best 40 ms, beyond the margin of 25%"
    )
    assert reasons["s12-f0.80"] == "excluded: no warm TTFT from the host tier was measured"


def test_margin_edge_is_inclusive():
    rec = recommend([result("s8-f0.80"), result("s16-f0.80", warm_host_ttft_s=0.050)], NEEDS)
    assert rec["choice"] == "s16-f0.80"  # 50 ms = 40 ms x 1.25
    rec = recommend([result("s8-f0.80"), result("s16-f0.80", warm_host_ttft_s=0.0501)], NEEDS)
    assert rec["choice"] == "s8-f0.80"


def test_ties_less_pinned_then_more_device_tokens():
    a = result("s16-f0.80", prefixes_held=8, pinned_bytes=32 * 10**9, device_tokens=150000)
    b = result("s24-f0.80", prefixes_held=8, pinned_bytes=48 * 10**9, device_tokens=190000)
    assert recommend([b, a], NEEDS)["choice"] == "s16-f0.80"
    c = result("s16-f0.85", prefixes_held=8, pinned_bytes=32 * 10**9, device_tokens=190000)
    rec = recommend([a, c], NEEDS)
    assert rec["choice"] == "s16-f0.85"
    assert rec["reasons"]["s16-f0.80"].endswith(
        "(the choice s16-f0.85 holds 8, with less pinned RAM or more GPU KV tokens)"
    )


def test_none_admissible():
    rec = recommend([result("s8-f0.80", status="failed_probe", error="probe timed out"),
                     result("s16-f0.80", parity_ok=False)], NEEDS)
    assert rec["choice"] is None
    assert set(rec["reasons"]) == {"s8-f0.80", "s16-f0.80"}
    assert rec["reasons"]["s8-f0.80"] == "excluded: failed_probe (probe timed out)"


def test_the_slack_absorbs_timer_noise_of_a_few_ms():
    # Measured on the simulator (TTFTs scaled x0.01): 9.1, 10.5 and 12.9 ms warm host reads of one config
    # family; the 25 % margin alone excluded the largest pool for 3.8 ms of jitter.
    results = [result(cid, warm_host_ttft_s=warm, ram_left_bytes=64 * 10**9)
               for cid, warm in (("s16-f0.80", 0.0105), ("s32-f0.80", 0.0091), ("s96-f0.80", 0.0129))]
    assert recommend(results, NEEDS)["choice"] == "s32-f0.80"
    rec = recommend(results, {**NEEDS, "warm_slack_s": 0.05})
    assert rec["choice"] == "s96-f0.80"
    assert rec["admissible"] == ["s96-f0.80", "s32-f0.80", "s16-f0.80"]
    # A read slower by more than margin + slack is still excluded, and the reason names both.
    slow = recommend([*results, result("s64-f0.80", warm_host_ttft_s=0.265, ram_left_bytes=64 * 10**9)],
                     {**NEEDS, "warm_slack_s": 0.05})
    assert slow["reasons"]["s64-f0.80"].startswith("excluded: warm host TTFT 265 ms is ")
    assert "beyond the margin of 25% + 50 ms" in slow["reasons"]["s64-f0.80"]


def test_bound_reached_says_at_least():
    rec = recommend([result("s8-f0.80", prefixes_bound_reached=True)], NEEDS)
    assert "holds at least 4 prefixes" in rec["reasons"]["s8-f0.80"]


@pytest.mark.parametrize(("key", "value"), [("warm_margin", -0.1), ("warm_margin", None), ("min_device_tokens", "x"),
                                                 ("warm_slack_s", -0.01)])
def test_bad_needs(key, value):
    with pytest.raises(SizingError, match=key):
        recommend([], {**NEEDS, key: value})


HICACHE_NOW = {
    "--enable-hierarchical-cache": True, "--hicache-size": 10, "--hicache-ratio": "2.0",
    "--hicache-io-backend": "kernel", "--hicache-host-memory-mode": "cache", "--hicache-write-policy": "write_through",
}
EVIDENCE = {"host": "gpu-a1", "date": "2026-12-03T18:00:00Z", "release_id": "0.5.23-abc", "sglang_version": "0.5.23",
            "report_path": "reports/sizing/gpu-a1/report.md", "fleet": "demo"}


def test_group_vars_round_trip(tmp_path):
    reason = "chosen: " + "holds 12 prefixes of 32,000 tokens, warm host TTFT 38 ms (best 38 ms) " * 3
    text = group_vars_text(result("s24-f0.85"), HICACHE_NOW, "ram64g_gfx1100x2", {**EVIDENCE, "reason": reason})
    data = yaml.safe_load(text)
    assert data == {
        "sglang_service_hicache_args": {**HICACHE_NOW, "--hicache-size": 24},
        "sglang_service_args": {"--mem-fraction-static": "0.85"},
    }
    assert "  --hicache-ratio: \"2.0\"\n" in text  # quoted as the inventories write it
    assert "  --hicache-size: 24\n" in text
    for needle in ("host gpu-a1", "release 0.5.23-abc, SGLang 0.5.23", "report reports/sizing/gpu-a1/report.md",
                   "inventories/demo/group_vars/ram64g_gfx1100x2.yml", "through the gate", "#   chosen: holds 12"):
        assert needle in text
    path = tmp_path / "ram64g_gfx1100x2.yml"
    path.write_text(text)
    lint = subprocess.run([str(REPO / ".venv/bin/yamllint"), "--strict", "-c", str(REPO / ".yamllint"), str(path)],
                          capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout


def test_group_vars_comment_cannot_break_yaml():
    evidence = {**EVIDENCE, "host": "a\nsglang_service_args: {}", "reason": "line one\nline: two"}
    data = yaml.safe_load(group_vars_text(result("s8-f0.80"), HICACHE_NOW, "ram64g_gfx1100x2", evidence))
    assert data["sglang_service_args"] == {"--mem-fraction-static": "0.80"}


def test_group_vars_bad_class():
    with pytest.raises(SizingError, match="class_name"):
        group_vars_text(result("s8-f0.80"), HICACHE_NOW, "ram64g-gfx1100x2", EVIDENCE)
