"""The rollout report and the A/B table say what the probe measured, host by host."""

import json
import re
from pathlib import Path

from plugins import load

ROOT = Path(__file__).resolve().parents[1]
fleet_report = load("roles/rollout/files/fleet_report.py", "fleet_report")


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
    assert "halted: demo-2 failed and was rolled back" in md
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


def three_host_run(tmp_path: Path, outcome: dict | None, paused: dict | None = None) -> tuple[str, dict]:
    """demo-1 passed; demo-2 wrote no record; demo-3 never started. Returns rollout.md, .json."""
    write_run(tmp_path, [{"host": "demo-1", "verdict": "passed", "config_hash": "a" * 64, "probe": probe(1900, 20)}])
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r3", "hosts": ["demo-1", "demo-2", "demo-3"]}))
    if outcome is not None:
        (tmp_path / "outcome.json").write_text(json.dumps(outcome))
    if paused is not None:
        (tmp_path / "paused.json").write_text(json.dumps(paused))
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    return (tmp_path / "rollout.md").read_text(), json.loads((tmp_path / "rollout.json").read_text())


def test_unreachable_host_halts_and_the_report_names_it_and_those_not_reached(tmp_path):
    lost = {"unreachable": True, "task": "Gate | probe cold/warm TTFT", "msg": "ssh: Connection closed"}
    outcome = {
        "hosts": {"demo-1": {"unreachable": False, "failed": False}, "demo-2": lost, "demo-3": {}},
        "locks": {"left": ["demo-1", "demo-2 (unreachable)", "demo-3"]},
    }
    md, report = three_host_run(tmp_path, outcome)
    assert "verdict: **halted: demo-2 was unreachable; not reached: demo-3**" in md
    assert "every host passed" not in md
    assert "| demo-2 | unreachable |" in md
    assert "| demo-3 | not reached |" in md
    assert "**demo-2**: unreachable at task 'Gate | probe cold/warm TTFT': ssh: Connection closed" in md
    assert "hosts reported: 1 ·" in md
    assert "not released (still this run's lock): demo-1, demo-2 (unreachable), demo-3" in md.split("## Run lock")[1]
    assert report["run"]["not_reached"] == ["demo-3"]
    assert [h["host"] for h in report["hosts"]] == ["demo-1"]
    assert [h["host"] for h in report["unreported"]] == ["demo-2"]


def test_run_still_going_claims_no_pass(tmp_path):
    md, _ = three_host_run(tmp_path, None)
    assert "verdict: **in progress: not reached yet: demo-2, demo-3**" in md


def test_run_ended_early_without_a_failure_is_halted(tmp_path):
    md, _ = three_host_run(tmp_path, {"hosts": {}})
    assert "verdict: **halted: the run ended early; not reached: demo-2, demo-3**" in md


def test_every_host_reported_passes_and_a_taken_over_lock_is_reported(tmp_path):
    write_run(tmp_path, [{"host": "demo-1", "verdict": "passed", "probe": probe(1900, 20)}])
    stale = "controller (/r/rollout.lock): taking over a stale lock: run r0 of root@ctl (pid 7)"
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r4", "hosts": ["demo-1"], "lock_warnings": [stale]}))
    (tmp_path / "outcome.json").write_text(json.dumps({"hosts": {"demo-1": {}}, "locks": {"left": []}}))
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    md = (tmp_path / "rollout.md").read_text()
    assert "verdict: **every host passed or was already validated**" in md
    assert f"- taken over: {stale}" in md.split("## Run lock")[1]


def test_a_host_found_on_an_unvalidated_release_passes_with_a_note(tmp_path):
    note = "main found running a release this host never validated; probed now without a restart: passed"
    write_run(tmp_path, [{"host": "demo-1", "verdict": "unchanged", "probe": {}},
                         {"host": "demo-2", "verdict": "passed", "probe": probe(1900, 20), "note": note}])
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r5", "hosts": ["demo-1", "demo-2"]}))
    (tmp_path / "outcome.json").write_text(json.dumps({"hosts": {"demo-1": {}, "demo-2": {}}, "locks": {"left": []}}))
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    md = (tmp_path / "rollout.md").read_text()
    assert "verdict: **every host passed or was already validated**" in md
    assert "| demo-2 | passed |" in md
    assert f"- **demo-2**: {note}" in md.split("## Notes")[1]


# ---- issue 24: text from a hostile server reaches the report and the terminal safe ----------------

EVIL = "boom\r\x1b[2J\x1b]0;pwned\x07 | cell | **bold** [link](http://evil.example/) <b>x</b>\n# heading\u202e"


def test_server_text_reaches_rollout_md_and_the_terminal_without_controls_or_markup(tmp_path, capsys):
    records = passed_then_rolled_back(note=EVIL, router=[f"left worker {EVIL}"])
    records[1]["probe"]["gate"]["reasons"] = [f"POST /generate answered HTTP 500: {EVIL}"]
    records[1]["verdict"] = EVIL
    write_run(tmp_path, records)
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    md = (tmp_path / "rollout.md").read_text()
    shown = capsys.readouterr().out
    for text in (md, shown):
        assert "\x1b" not in text
        assert "\r" not in text
        assert "\u202e" not in text
        assert "boom" in text
        assert "pwned" in text
        assert "[link](" not in text
        assert "**bold**" not in text
        assert not re.search(r"(?<!\\)<b>", text)
        assert "\n# heading" not in text
    # The table keeps its columns: the verdict's | is escaped in its cell.
    row = next(line for line in md.splitlines() if line.startswith("| demo-2 |"))
    assert row.count("|") - row.count("\\|") == 10
    report = json.loads((tmp_path / "rollout.json").read_text())
    assert "boom" in json.dumps(report)


def test_ab_table_escapes_the_model_and_case_names(tmp_path):
    record = {"host": "demo-1", "cases": [{"name": EVIL, "median_ttft_ms": 1.0}],
              "release": {"config_hash": "c" * 64, "python": "/x", "model": "m`]" + EVIL}, "config_hashes": {}}
    table = ab_table(tmp_path, record)
    assert "\x1b" not in table
    row = next(line for line in table.splitlines() if line.startswith("| boom"))
    assert "[link](" not in row
    assert "m']" in table  # the model's backtick cannot end its code span


def test_a_paused_run_says_paused_names_the_hosts_left_and_the_command(tmp_path):
    command = "ansible-playbook -i inventories/demo /p/site.yml -e rollout_continue=r1"
    paused = {"run_id": "r1", "after_batch": 1, "pause_after": "canary", "passed": ["demo-1"],
              "left": ["demo-2", "demo-3"], "releases": {}, "command": command}
    md, report = three_host_run(tmp_path, {"hosts": {}}, paused)
    assert ("verdict: **paused after batch 1 (rollout_pause_after=canary): not started: demo-2, demo-3; "
            f"continue with: {command}**") in md
    assert "| demo-2 | paused: not started |" in md
    assert "halted" not in md
    assert report["run"]["not_reached"] == []
    # A pause does not hide a failure: a host that failed before the pause halts the run.
    failed = {"hosts": {"demo-2": {"failed": True, "task": "Gate", "msg": "boom"}}}
    md, _ = three_host_run(tmp_path / "again", failed, paused)
    assert "verdict: **halted" in md


def test_the_report_shows_what_was_warm_when_each_host_rejoined(tmp_path):
    warm = {"main": {"warm_tokens": 48000, "cached_tokens": 0, "seconds": 2.4, "failed_files": ["docs.json"]}}
    write_run(tmp_path, [{"host": "demo-1", "verdict": "passed", "probe": probe(1900, 20), "warm": warm},
                         {"host": "demo-2", "verdict": "passed", "probe": probe(1900, 20)}])
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    md = (tmp_path / "rollout.md").read_text()
    section = md.split("## Warm rejoin")[1]
    assert "| demo-1 | main | 48,000 | 0 | 2.4 s | docs.json |" in section
    assert "demo-2" not in section


def test_the_report_shows_the_l3_tier_read_after_the_restart_and_after_a_flush(tmp_path):
    with_l3 = probe(1900, 20)
    with_l3["restart_hit"] = {"prompt_tokens": 32000, "storage_cached_tokens": 31999, "ttft_ms": 41.5}
    with_l3["warm"]["storage"] = {"median_ttft_ms": 38.0, "storage_cached_fraction": 0.9999}
    write_run(tmp_path, [{"host": "demo-1", "verdict": "passed", "probe": with_l3},
                         {"host": "demo-2", "verdict": "passed", "probe": probe(1900, 20)}])
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    section = (tmp_path / "rollout.md").read_text().split("## L3 storage tier")[1]
    row = "| demo-1 | 31,999 of 32,000 tokens from storage, TTFT 41.5 ms | 100.0 % from storage, TTFT 38.0 ms |"
    assert row in section
    assert "demo-2" not in section
