"""Issue 25 item 2: the rollout record keeps the pools the probe checked after start, and rollout.md
shows each host's GPU KV capacity, its host pool against the plan and the HiCache cost against the
host's baseline (the report's -31.5 %)."""

from __future__ import annotations

import json
from pathlib import Path

from plugins import load

fleet_report = load("roles/rollout/files/fleet_report.py", "fleet_report_pools")
rollout = load("roles/rollout/filter_plugins/rollout.py", "rollout_filters_pools")

POOLS = {"device_tokens": 159692, "kvcache_gb": 4.874, "host_tokens": 366211, "host_expected": [192743, 366211],
         "host_source": "/metrics sglang:hicache_host_total_tokens", "failures": [],
         "hicache_cost": {"baseline_device_tokens": 233207, "baseline_hicache": False, "device_tokens": 159692,
                          "change_pct": -31.5}}


def test_the_gate_record_keeps_the_pools():
    record = rollout.rollout_gate_summary({"item": {"name": "main"}, "pools": POOLS, "server": {}})
    pools = record["probe"]["pools"]
    assert pools["device_tokens"] == 159692
    assert pools["host_expected"] == [192743, 366211]
    assert pools["hicache_cost"]["change_pct"] == -31.5
    assert "failures" not in pools
    assert rollout.rollout_gate_summary({"item": {"name": "main"}})["probe"]["pools"] == {}


def test_rollout_md_shows_capacity_host_pool_and_cost(tmp_path: Path):
    (tmp_path / "hosts").mkdir()
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r1", "inventory": "inventories/demo"}))
    probe = {"cold": {"median_ttft_ms": 192000}, "warm": {}, "gate": {"passed": True, "reasons": []},
             "pools": POOLS}
    records = [{"host": "demo-1", "verdict": "passed", "config_hash": "a" * 64, "probe": probe, "order": 0},
               {"host": "demo-2", "verdict": "passed", "config_hash": "a" * 64, "order": 1,
                "probe": {**probe, "pools": {}}}]
    for record in records:
        (tmp_path / "hosts" / f"{record['host']}.json").write_text(json.dumps(record))
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    md = (tmp_path / "rollout.md").read_text()
    assert "## KV pools" in md
    assert "| demo-1 | 159,692 | 366,211 (plan 192,743–366,211) | -31.5 % vs 233,207 (without HiCache) |" in md
    assert "| demo-2 |" not in md.split("## KV pools")[1]  # no pools recorded: no row
