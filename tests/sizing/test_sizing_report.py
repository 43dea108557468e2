"""playbooks/files/hicache_sizing_report.py on a sweep directory: report, chart, recommendation, group_vars."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import yaml
from ansible.module_utils.sglang_sizing import plan_candidates

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "playbooks" / "files" / "hicache_sizing_report.py"
GiB = 1024**3


def run(sweep: Path) -> subprocess.CompletedProcess:
    """The script under umask 077: the files must come out 0644 all the same."""
    return subprocess.run(["sh", "-c", 'umask 077; exec "$0" "$@"', str(REPO / ".venv" / "bin" / "python"),
                           str(SCRIPT), str(sweep)], capture_output=True, text=True, check=False, timeout=120)


def make_sweep(tmp_path: Path) -> Path:
    sweep = tmp_path / "sweep"
    (sweep / "results").mkdir(parents=True)
    candidates = plan_candidates({
        "sizes_gb": [8, 16, 28], "mem_fractions": [0.80, 0.85], "tp": 2, "mem_total_bytes": 64 * GiB,
        "mem_available_bytes": 60 * GiB, "reserve_bytes": 4 * 10**9, "max_candidates": 3,
    })
    plan = {
        "host": "gpu-a1", "release_id": "rel-b", "sglang_version": "0.5.23", "started": "2026-12-03T18:00:00Z",
        "fleet": "demo", "facts": {"mem_total_mb": 64216, "gpu_model": "gfx1100", "gpu_count": 2},
        "hicache_args_now": {"--enable-hierarchical-cache": True, "--hicache-size": 10, "--hicache-ratio": "2.0"},
        "needs": {"min_device_tokens": 32000, "warm_margin": 0.25, "reserve_bytes": 4 * 10**9},
        "bound_s": 3600, "candidates": candidates,
    }
    (sweep / "plan.json").write_text(json.dumps(plan))
    planned = [c["id"] for c in candidates if c["status"] == "planned"]
    assert planned == ["s8-f0.80", "s16-f0.80", "s16-f0.85"]

    def res(cid, **over):
        size = int(cid.split("-")[0][1:])
        data = {"id": cid, "release_id": "rel-b", "size_gb": size, "mem_fraction": float(cid.split("-f")[1]),
                "status": "ok", "error": "", "start_s": 31.0, "device_tokens": 159692, "host_tokens": size * 30000,
                "pinned_bytes": size * 2 * 10**9, "ram_left_bytes": 60 * 10**9 - size * 2 * 10**9,
                "ram_source": "simulator", "cold_ttft_s": 1.9, "warm_device_ttft_s": 0.03, "warm_host_ttft_s": 0.04,
                "parity_ok": True, "prefixes_held": size // 2, "prefixes_bound_reached": False, "prefix_len": 32000,
                "elapsed_s": 70.0}
        data.update(over)
        (sweep / "results" / f"{cid}.json").write_text(json.dumps(data))

    res("s8-f0.80")
    res("s16-f0.80", warm_host_ttft_s=0.042)
    res("s16-f0.85", status="failed_start", error="server not healthy after 600 s", device_tokens=None)
    return sweep


def test_report_files(tmp_path):
    sweep = make_sweep(tmp_path)
    # A result of another release is ignored and said so.
    (sweep / "results" / "old.json").write_text(json.dumps({"id": "s8-f0.80", "release_id": "rel-a", "status": "ok"}))
    proc = run(sweep)
    assert proc.returncode == 0, proc.stderr
    assert "recommendation: s16-f0.80" in proc.stdout
    assert "s16-f0.85  failed_start" in proc.stdout
    for name in ("report.md", "chart.png", "recommendation.json", "group_vars/ram64g_gfx1100x2.yml"):
        mode = stat.S_IMODE((sweep / name).stat().st_mode)
        assert mode == 0o644, (name, oct(mode))
    assert stat.S_IMODE((sweep / "group_vars").stat().st_mode) == 0o755
    png = (sweep / "chart.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(png) > 10000
    rec = json.loads((sweep / "recommendation.json").read_text())
    assert rec["choice"] == "s16-f0.80"
    assert rec["class"] == "ram64g_gfx1100x2"
    assert any("rel-a" in n for n in rec["ignored_results"])
    report = (sweep / "report.md").read_text()
    assert "# HiCache sizing: gpu-a1 (class ram64g_gfx1100x2)" in report
    assert "**s16-f0.80**: chosen: holds 8 prefixes of 32,000 tokens, warm host TTFT 42 ms (best 40 ms)" in report
    # Every candidate is in the table, pruned ones with their rule, the failed one with its error.
    assert "| s28-f0.80 | pruned |" in report
    assert "SGLang's admission rule" in report
    assert "| s8-f0.85 | pruned |" in report
    assert "over the bound: max_candidates = 3" in report
    assert "excluded: failed_start (server not healthy after 600 s)" in report
    assert "measured on release 'rel-a'" in report
    gv = yaml.safe_load((sweep / "group_vars" / "ram64g_gfx1100x2.yml").read_text())
    assert gv["sglang_service_hicache_args"]["--hicache-size"] == 16
    assert gv["sglang_service_args"] == {"--mem-fraction-static": "0.80"}


def test_no_admissible_candidate_writes_no_group_vars(tmp_path):
    sweep = make_sweep(tmp_path)
    assert run(sweep).returncode == 0
    assert (sweep / "group_vars" / "ram64g_gfx1100x2.yml").is_file()
    for path in (sweep / "results").glob("*.json"):
        data = json.loads(path.read_text())
        data["parity_ok"] = False
        path.write_text(json.dumps(data))
    proc = run(sweep)
    assert proc.returncode == 0, proc.stderr
    assert "recommendation: none admissible" in proc.stdout
    assert not (sweep / "group_vars" / "ram64g_gfx1100x2.yml").exists()  # the earlier run's file is gone
    assert "No candidate is admissible" in (sweep / "report.md").read_text()
    assert (sweep / "chart.png").read_bytes()[:4] == b"\x89PNG"


def test_interrupted_sweep_lists_not_run(tmp_path):
    sweep = make_sweep(tmp_path)
    (sweep / "results" / "s16-f0.80.json").unlink()
    proc = run(sweep)
    assert proc.returncode == 0, proc.stderr
    assert "| s16-f0.80 | not_run |" in (sweep / "report.md").read_text()
    assert json.loads((sweep / "recommendation.json").read_text())["choice"] == "s8-f0.80"


def test_bad_inputs(tmp_path):
    proc = run(tmp_path / "absent")
    assert proc.returncode == 2
    assert "no such sweep directory" in proc.stderr
    sweep = make_sweep(tmp_path)
    (sweep / "plan.json").write_text("{not json")
    proc = run(sweep)
    assert proc.returncode == 2
    assert f"{sweep / 'plan.json'}: not valid JSON" in proc.stderr
    (sweep / "plan.json").write_text(json.dumps({"host": "x"}))
    proc = run(sweep)
    assert proc.returncode == 2
    assert "the key 'release_id' is missing" in proc.stderr
    plan = {"host": "x", "release_id": "r", "facts": {"gpu_model": "gfx1100", "gpu_count": 1},
            "needs": {"min_device_tokens": 1, "warm_margin": 0.25, "reserve_bytes": 0}, "candidates": []}
    (sweep / "plan.json").write_text(json.dumps(plan))
    proc = run(sweep)
    assert proc.returncode == 2
    assert "mem_total_mb must be a whole number" in proc.stderr
    assert not (sweep / "report.md").exists()
