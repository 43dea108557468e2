"""The rollout report and the A/B table say what the probe measured, host by host."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("fleet_report", ROOT / "scripts" / "fleet_report.py")
fleet_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fleet_report)


def probe(cold_ms: float, warm_ms: float, reasons: list[str] | None = None) -> dict:
    return {
        "cold": {"median_ttft_ms": cold_ms},
        "warm": {
            "host": {
                "median_ttft_ms": warm_ms,
                "warm_cold_ratio": warm_ms / cold_ms,
                "speedup": cold_ms / warm_ms,
                "cached_fraction": 0.999,
                "host_cached_fraction": 0.97 if not reasons else 0.0,
            }
        },
        "gate": {"passed": not reasons, "reasons": reasons or []},
    }


def write_run(run_dir: Path, records: list[dict]) -> None:
    (run_dir / "hosts").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r1", "inventory": "inventories/demo"}))
    for order, record in enumerate(records):
        record["order"] = order
        (run_dir / "hosts" / f"{record['host']}.json").write_text(json.dumps(record))


def passed_then_rolled_back(first_verdict: str = "passed", **second: object) -> list[dict]:
    """A good first host, then one whose host tier did nothing (rolled back)."""
    return [
        {"host": "demo-1", "verdict": first_verdict, "config_hash": "a" * 64, "probe": probe(192000, 2650)},
        {
            "host": "demo-2",
            "verdict": "rolled back",
            "config_hash": "b" * 64,
            "probe": probe(192000, 150000, ["host-tier cached fraction 0.000 < min_host_cached_fraction 0.9"]),
            **second,
        },
    ]


def test_rollout_report_names_each_host_and_the_violated_threshold(tmp_path):
    write_run(tmp_path, passed_then_rolled_back())
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    md = (tmp_path / "rollout.md").read_text()
    assert "| demo-1 | passed | 192.00 s | 2.65 s (host) |" in md
    assert "72.5×" in md
    assert "**demo-2**: host-tier cached fraction 0.000 < min_host_cached_fraction 0.9" in md
    assert "stopped: a host failed its gate" in md
    report = json.loads((tmp_path / "rollout.json").read_text())
    assert [h["host"] for h in report["hosts"]] == ["demo-1", "demo-2"]
    assert (tmp_path / "ttft.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def ab_table(tmp_path, record: dict) -> str:
    """Write an A/B record, run `fleet_report.py ab` on it, return the Markdown table."""
    path = tmp_path / "ab.json"
    path.write_text(json.dumps(record))
    assert fleet_report.main(["ab", str(path)]) == 0
    return (tmp_path / "ab.md").read_text()


def test_ab_table_reports_capacity_change(tmp_path):
    record = {
        "host": "demo-1",
        "input_len": 128000,
        "repeats": 3,
        "cases": [
            {"name": "baseline cold", "hicache": False, "median_ttft_ms": 192000, "max_total_num_tokens": 233207},
            {"name": "HiCache cold", "hicache": True, "median_ttft_ms": 192500, "max_total_num_tokens": 159692},
            {"name": "HiCache warm", "hicache": True, "median_ttft_ms": 2650, "max_total_num_tokens": 159692},
        ],
    }
    md = ab_table(tmp_path, record)
    assert "| HiCache cold | 192.50 s |" in md
    assert "233,207" in md
    assert "-31.5 %" in md
    assert (tmp_path / "ab.png").exists()


def test_ab_table_names_the_release_it_ran_on(tmp_path):
    record = {
        "host": "demo-3",
        "release": {"config_hash": "d7744063224d" + "0" * 52, "python": "/opt/sglang/venvs/r1/bin/python",
                    "model": "/srv/models/m", "draft": ""},
        "config_hashes": {"baseline": "aaaa" * 16, "hicache": "d7744063224d" + "0" * 52},
        "cases": [{"name": "baseline · cold", "hicache": False, "median_ttft_ms": 900, "max_total_num_tokens": 233207}],
    }
    md = ab_table(tmp_path, record)
    assert "config `d7744063224d`: python `/opt/sglang/venvs/r1/bin/python`, model `/srv/models/m`." in md
    assert "baseline `aaaaaaaaaaaa`, hicache `d7744063224d` (hicache = the served release)" in md


def test_check_mode_run_claims_no_pass(tmp_path):
    write_run(tmp_path, [{"host": "demo-1", "verdict": "would be probed (check mode)", "probe": {}}])
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r2", "check_mode": True}))
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    md = (tmp_path / "rollout.md").read_text()
    assert "check mode: nothing was restarted, probed or validated" in md
    assert "| demo-1 | would be probed (check mode) |" in md
    assert "passed" not in md.split("| host |")[1]


def test_router_moves_are_listed_per_host(tmp_path):
    moves = ["left http://10.0.0.2:30000", "joined http://10.0.0.2:30000"]
    write_run(tmp_path, passed_then_rolled_back("unchanged", router=moves))
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    md = (tmp_path / "rollout.md").read_text()
    section = md.split("## Router rotation", 1)[1]
    assert "- **demo-2**: left http://10.0.0.2:30000; joined http://10.0.0.2:30000" in section
    assert "demo-1" not in section
