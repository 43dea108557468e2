"""Verify playbooks/hicache_sizing.yml on two hosts site.yml deployed, behind a real router: what the
sweeps wrote on the controller, what they said, and the hosts the rollout of their group_vars files left.

The SIMULATOR plays the GPU server; sizing-1's was told 48 GB of RAM, sizing-2's 256 GB. The side effect
ran a check-mode sweep, a sweep of each host, a sweep of sizing-2 killed midway and resumed, then
site.yml with each class's group_vars file (outputs in the ephemeral directory).
"""

from __future__ import annotations

import json
import os
import re
import struct
import urllib.request
from pathlib import Path

import pytest
import testinfra.utils.ansible_runner
import yaml

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

PROJECT = Path(__file__).resolve().parents[3]
REPORTS = PROJECT / ".cache" / "hicache-sizing-reports"
EPHEMERAL = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY") or Path(inventory).resolve().parents[1])
ROUTER = "http://127.0.28.250:30100"
ADDRESS = {"sizing-1": "127.0.28.1", "sizing-2": "127.0.28.2"}
RAM_GB = {"sizing-1": 48, "sizing-2": 256}
TP = 2
RESERVE_GB = 4  # inventories/demo sglang_service_memory_reserve_gb
SGLANG_RESERVE = 10 * 1024**3  # SGLang 0.5.23's own host-memory reserve


def sweep_dir(reports: Path, host: str) -> Path:
    found = sorted(reports.glob(f"{host}-*"))
    assert len(found) == 1, f"expected one sweep of {host} in {reports}, found {found}"
    return found[0]


def recommendation(reports: Path, host: str) -> dict:
    return json.loads((sweep_dir(reports, host) / "recommendation.json").read_text())


def results(reports: Path, host: str) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (sweep_dir(reports, host) / "results").glob("*.json")}


def log(name: str) -> str:
    """A nested run's output with Ansible's line folding undone (one space between words)."""
    return " ".join((EPHEMERAL / f"{name}.log").read_text().split())


def chosen(host: str) -> dict:
    rec = recommendation(REPORTS, host)
    return results(REPORTS, host)[rec["choice"]]


def test_check_mode_printed_the_plan_only():
    out = log("sweep-check")
    assert "s8-f0.80: --hicache-size 8 --mem-fraction-static 0.80: to measure" in out, out[-3000:]
    # The 48 GB host cannot admit 2 x 24 GB: pruned, by SGLang's rule, before any start.
    assert "s24-f0.80: --hicache-size 24 --mem-fraction-static 0.80: pruned:" in out, out[-3000:]
    assert "SGLang's admission rule" in out, out[-3000:]
    assert "start it (the real unit stops" not in out


@pytest.mark.parametrize("host", ["sizing-1", "sizing-2"])
def test_each_sweep_wrote_its_table_chart_and_group_vars(host):
    sweep = sweep_dir(REPORTS, host)
    report = (sweep / "report.md").read_text()
    rec = recommendation(REPORTS, host)
    assert rec["choice"], rec
    assert rec["choice"] in report
    png = (sweep / "chart.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24])[0] >= 600
    group_vars = sweep / rec["group_vars"]
    data = yaml.safe_load(group_vars.read_text())
    chosen_result = results(REPORTS, host)[rec["choice"]]
    assert data["sglang_service_hicache_args"]["--hicache-size"] == chosen_result["size_gb"]
    assert data["sglang_service_args"]["--mem-fraction-static"] == f"{chosen_result['mem_fraction']:.2f}"
    # Every measured candidate is in the table.
    for cid in results(REPORTS, host):
        assert cid in report, (cid, report)


def test_the_two_classes_get_different_sizes_each_within_its_ram():
    sizes = {}
    for host in ("sizing-1", "sizing-2"):
        result = chosen(host)
        pinned = result["size_gb"] * 1e9 * TP
        assert pinned + RESERVE_GB * 1e9 <= RAM_GB[host] * 1e9, (host, result)
        assert pinned <= RAM_GB[host] * 1e9 - SGLANG_RESERVE, (host, result)
        assert result["status"] == "ok", result
        assert result["parity_ok"] is True, result
        sizes[host] = result["size_gb"]
    assert sizes["sizing-2"] > sizes["sizing-1"], sizes
    assert recommendation(REPORTS, "sizing-1")["class"] != recommendation(REPORTS, "sizing-2")["class"]


def test_more_host_ram_holds_more_prefixes_measured_not_computed():
    held = {host: chosen(host)["prefixes_held"] for host in ("sizing-1", "sizing-2")}
    assert held["sizing-2"] > held["sizing-1"] >= 1, held
    # Measured against the pool the server reported (one more at most: the oldest prefix may keep
    # enough of its pages to count).
    for host in ("sizing-1", "sizing-2"):
        result = chosen(host)
        if not result["prefixes_bound_reached"]:
            fits = result["host_tokens"] // result["prefix_len"]
            assert fits <= result["prefixes_held"] <= fits + 1, result


def test_a_candidate_that_fails_to_start_is_recorded_and_the_sweep_went_on():
    found = results(REPORTS, "sizing-1")
    failed = {cid: r for cid, r in found.items() if r["status"] == "failed_start"}
    assert set(failed) == {"s8-f0.50", "s16-f0.50"}, {cid: r["status"] for cid, r in found.items()}
    for result in failed.values():
        assert "Not enough memory" in result["error"], result["error"][:500]
    ok = {cid for cid, r in found.items() if r["status"] == "ok"}
    assert ok == {"s8-f0.80", "s8-f0.85", "s16-f0.80", "s16-f0.85"}


def test_the_killed_sweep_resumed_and_recommends_what_the_whole_one_did():
    whole = Path(f"{REPORTS}-whole")
    assert recommendation(REPORTS, "sizing-2")["choice"] == recommendation(whole, "sizing-2")["choice"]
    assert set(results(REPORTS, "sizing-2")) == set(results(whole, "sizing-2"))
    out = log("sweep-resumed")
    assert "measured before (kept: this run resumes)" in out, out[-3000:]
    orphan = log("orphan")
    # After the kill systemd ended the candidate at its RuntimeMaxSec and started the real unit.
    after = orphan.split("after:", 1)[1]
    assert "ActiveState=failed" in after, orphan
    assert "Result=timeout" in after, orphan


def test_the_rollout_of_the_group_vars_passed_the_gate():
    out = log("rollout-classes")
    assert re.search(r"sizing-1\s*: ok=\d+ .*failed=0", out), out[-3000:]
    assert re.search(r"sizing-2\s*: ok=\d+ .*failed=0", out), out[-3000:]


def test_each_host_runs_its_class_size_and_no_candidate_unit(host):
    name = host.backend.get_hostname()
    result = chosen(name)
    unit = host.file("/etc/systemd/system/sglang-main.service").content_string
    assert re.search(rf"--hicache-size {result['size_gb']}\b", unit), unit
    assert f"--mem-fraction-static {result['mem_fraction']:.2f}" in unit, unit
    assert host.service("sglang-main.service").is_running
    assert not host.file("/run/systemd/system/sglang-main-sizing.service").exists


def test_both_hosts_are_in_the_router():
    with urllib.request.urlopen(f"{ROUTER}/workers", timeout=10) as response:
        workers = json.load(response)
    urls = {w["url"] for w in workers["workers"]}
    for address in ADDRESS.values():
        assert f"http://{address}:30004" in urls, workers


# --- Issue 27: the L3 tier and the warm rejoin, on the class rollout that ended the side effect -------
HANDBOOK = Path(__file__).resolve().parents[1] / "warm" / "handbook.txt"


def last_rollout() -> Path:
    runs = [p for p in (EPHEMERAL / "reports").iterdir() if (p / "rollout.json").exists()]
    assert runs, f"no rollout report under {EPHEMERAL / 'reports'}"
    return max(runs, key=lambda p: (p / "rollout.json").stat().st_mtime)


def classes_rollout() -> Path:
    """The class rollout's run directory (step 5; the side effect noted it before step 6)."""
    return EPHEMERAL / "reports" / (EPHEMERAL / "rollout-classes.dir").read_text().strip()


def l3_dirs() -> dict:
    return json.loads((EPHEMERAL / "l3-dirs.json").read_text())


def test_after_the_class_rollout_each_host_read_its_earlier_prefix_back_from_storage():
    assert classes_rollout() != last_rollout()
    report = json.loads((classes_rollout() / "rollout.json").read_text())
    records = {r["host"]: r for r in report["hosts"]}
    assert set(records) == {"sizing-1", "sizing-2"}, records.keys()
    for host, record in records.items():
        assert record["verdict"] == "passed", record
        probe = record["probe"]
        hit = probe["restart_hit"]
        assert hit["storage_cached_tokens"] >= 0.8 * hit["prompt_tokens"], (host, hit)
        assert probe["warm"]["storage"]["storage_cached_fraction"] >= 0.8, (host, probe["warm"]["storage"])
    md = (classes_rollout() / "rollout.md").read_text()
    assert "## L3 storage tier" in md
    assert "## Warm rejoin" in md


def test_the_class_rollout_kept_one_identity_and_revision_2_replaced_it():
    dirs = l3_dirs()
    for host in ("sizing-1", "sizing-2"):
        before, after = dirs["before"][host], dirs["after"][host]
        assert len(before) == 1, dirs  # the class rollout kept the identity: one directory
        # Revision 2 changed the model's manifest hash: a directory of its own; revision 1's is gone
        # once revision 2 passed its gate (neither running nor validated: the previous release keeps
        # its files, not its cache pages).
        assert len(after) == 1, dirs
        assert after[0] != before[0], dirs


def test_revision_2_passed_its_gate_reading_nothing_of_the_old_identity():
    out = log("rollout-revision")
    for host in ("sizing-1", "sizing-2"):
        assert re.search(rf"{host}\s*: ok=\d+ .*failed=0", out), out[-3000:]
    report = json.loads((last_rollout() / "rollout.json").read_text())
    for record in report["hosts"]:
        assert record["verdict"] == "passed", record
        # The first read after the restart is the prefix served before it: from an empty directory
        # of the new identity nothing comes from storage (the old identity is never read), and the
        # restart check is not applied (the validated record names another identity).
        hit = record["probe"]["restart_hit"]
        assert hit["storage_cached_tokens"] == 0, (record["host"], hit)
        checks = [c["name"] for c in record["probe"]["gate"]["checks"]]
        assert not any("restart_storage" in name for name in checks), checks
        # The tier itself still proves itself on the new directory.
        assert record["probe"]["warm"]["storage"]["storage_cached_fraction"] >= 0.8, record["probe"]["warm"]


def test_the_l3_directory_is_the_services_alone(host):
    current = l3_dirs()["after"][host.backend.get_hostname()]
    entries = host.check_output("ls -1 /var/lib/sglang/l3/main").split()
    assert sorted(entries) == sorted(current), (entries, current)
    for entry in entries:
        directory = host.file(f"/var/lib/sglang/l3/main/{entry}")
        assert directory.user == "sglang"
        assert directory.mode == 0o700
        # Nobody else on the host can read it.
        assert host.run(f"runuser -u nobody -- ls /var/lib/sglang/l3/main/{entry}").rc != 0
    # The new identity's directory filled during revision 2's gate and warm-up.
    assert int(host.check_output(f"du -sb /var/lib/sglang/l3/main/{entries[0]} | cut -f1")) > 0


def test_a_warm_set_document_through_the_router_is_a_cache_hit():
    body = json.dumps({"text": HANDBOOK.read_text(), "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    request = urllib.request.Request(f"{ROUTER}/generate", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        meta = json.load(response)["meta_info"]
    assert meta["cached_tokens"] >= 0.9 * meta["prompt_tokens"], meta
