"""scripts/fleet_status.py (playbooks/status.yml's report): the figures it reads off /metrics and
the problems its verdict names."""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("fleet_status", ROOT / "scripts" / "fleet_status.py")
FS = importlib.util.module_from_spec(spec)
spec.loader.exec_module(FS)

BASE = 'model_name="m",engine_type="unified"'
METRICS_OK = f"""# TYPE sglang:cached_tokens counter
sglang:cached_tokens_total{{{BASE},cache_source="device"}} 100.0
sglang:cached_tokens_total{{{BASE},cache_source="host"}} 700.0
sglang:prompt_tokens_total{{{BASE},is_streaming="false"}} 600.0
sglang:prompt_tokens_total{{{BASE},is_streaming="true"}} 400.0
sglang:hicache_host_used_tokens{{{BASE},tp_rank="0",pp_rank="0",moe_ep_rank="0"}} 50.0
sglang:hicache_host_total_tokens{{{BASE},tp_rank="0",pp_rank="0",moe_ep_rank="0"}} 200.0
"""
METRICS_NO_HOST = METRICS_OK.replace('cache_source="host"} 700.0', 'cache_source="host"} 0.0')
RECORD = {"instances": {"main": {"config_hash": "abc123", "probe": {
    "cold": {"median_ttft_ms": 900.0}, "warm": {"host": {"median_ttft_ms": 15.0}}}}}}


def status(metrics: list, current: list, workers: list) -> dict:
    hosts = []
    for i, (text, link) in enumerate(zip(metrics, current, strict=True), start=1):
        hosts.append({
            "host": f"h{i}", "record": base64.b64encode(json.dumps(RECORD).encode()).decode(),
            "record_mtime": 1_790_000_000,
            "endpoints": [{"instance": "main", "target": f"127.0.0.{i}:30004"}],
            "current": [{"lnk_source": link} if link else {"exists": False}],
            "metrics": [text], "metrics_status": [200 if text else -1],
        })
    return {"time": "t", "inventory": "inv", "hosts": hosts, "router": {"url": "r", "workers": workers}}


def test_parse_metrics_adds_label_sets():
    m = FS.parse_metrics(METRICS_OK)
    assert m == {"cached_device": 100.0, "cached_host": 700.0, "prompt": 1000.0, "host_used": 50.0,
                 "host_total": 200.0}


def test_a_healthy_fleet_has_one_clean_verdict(tmp_path):
    s = status([METRICS_OK], ["/var/lib/sglang/main/releases/abc123"],
               [{"url": "http://127.0.0.1:30004", "is_healthy": True}])
    rows = FS.instance_rows(s)
    assert rows[0]["validated"]
    assert rows[0]["host_pct"] == 70.0
    text = FS.status_markdown(s, rows, None)
    assert "verdict: **all 1 instances serve their validated release" in text
    assert "| 10.0 % / 70.0 % | 25.0 % | healthy |" in text


def test_each_problem_is_named():
    s = status([METRICS_NO_HOST, None], ["/x/releases/other", "/x/releases/abc123"],
               [{"url": "http://127.0.0.1:30004", "is_healthy": False}])
    issues = FS.problems(FS.instance_rows(s), s)
    assert issues == [
        "h1/main: HiCache on but no token ever came from the host tier",
        "h1/main: runs release other, not the validated one",
        "h1/main: unhealthy in the router",
        "h2/main: /metrics does not answer",
        "h2/main: missing in the router",
    ]


def test_main_writes_markdown_and_chart(tmp_path, capsys):
    (tmp_path / "status.json").write_text(json.dumps(status([METRICS_OK], [None], [])))
    assert FS.main([str(tmp_path)]) == 0
    assert (tmp_path / "status.png").stat().st_size > 1000
    assert "running release unknown" in (tmp_path / "status.md").read_text()
    assert "# hicache-fleet status" in capsys.readouterr().out
