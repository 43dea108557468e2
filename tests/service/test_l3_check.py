"""Preflight of the L3 tier (issue 27, item 1): the size limit against the free disk under
sglang_service_l3_dir (less what the identity's directory already holds), and the rules of the plan
(HiCache on, a limit > 0, an eviction ratio in (0, 1], no other storage backend, a directory apart from
the instances' state directories). The disk check runs through real Ansible on localhost: refused
with a message naming the variable, before anything is created."""

from __future__ import annotations

import json
from pathlib import Path

from plugins import load
from service_render import FAIL_WITH_FINDINGS, run_check

ROOT = Path(__file__).resolve().parents[2]
pf = load(ROOT / "roles" / "preflight" / "filter_plugins" / "preflight.py")
sc = load("roles/sglang_service/filter_plugins/sglang_service_checks.py", "sglang_service_checks")
disk = load(ROOT / "module_utils" / "fleet_free_disk.py")

L3 = {"root": "/var/lib/sglang/l3", "dir": "/var/lib/sglang/l3/main/0123456789abcdef", "id": "0123456789abcdef",
      "max_size_bytes": 50_000_000_000, "eviction_ratio": 0.9}


def entry(**extra) -> dict:
    return {"name": "main", "unit": "sglang-main.service", "state_dir": "/var/lib/sglang/main", "hicache": True,
            "l3_requested": True, "l3": dict(L3), "args": {"--hicache-storage-backend": "file"}, **extra}


def test_a_sound_tier_has_no_finding():
    assert sc.l3_findings([entry()]) == []
    assert sc.l3_findings([entry(l3_requested=False, l3={})]) == []


def test_tier_without_hicache_is_refused_naming_the_variables():
    (finding,) = sc.l3_findings([entry(hicache=False, l3={})])
    assert "sglang-main.service" in finding
    assert "needs HiCache" in finding
    assert "sglang_service_l3_enabled" in finding
    assert "sglang_service_hicache_enabled" in finding


def test_limit_ratio_and_backend():
    (finding,) = sc.l3_findings([entry(l3={**L3, "max_size_bytes": 0})])
    assert "set sglang_service_l3_max_size_gb" in finding
    (finding,) = sc.l3_findings([entry(l3={**L3, "eviction_ratio": 1.5})])
    assert "sglang_service_l3_eviction_ratio = 1.5 is not in (0, 1]" in finding
    (finding,) = sc.l3_findings([entry(args={"--hicache-storage-backend": "nixl"})])
    assert "--hicache-storage-backend nixl" in finding


def test_directory_overlapping_a_state_directory_is_refused():
    named_l3 = entry(name="l3", unit="sglang-l3.service", state_dir="/var/lib/sglang/l3", l3_requested=False, l3={})
    (finding,) = sc.l3_findings([entry(), named_l3])
    assert "sglang_service_l3_dir = /var/lib/sglang/l3 overlaps the state directory of instance l3" in finding
    assert sc.l3_findings([entry(), entry(name="two", state_dir="/var/lib/sglang/two")]) == []


def test_disk_need_is_the_limit_less_what_the_directory_holds():
    plan = [entry(), entry(name="two", l3={**L3, "dir": "/var/lib/sglang/l3/two/x"}), entry(name="off", l3={})]
    used = [{"item": {"name": "main"}, "rc": 0, "stdout": "20000000000\t/var/lib/sglang/l3/main/0123456789abcdef"},
            {"item": {"name": "two"}, "rc": 1, "stdout": ""}]
    needs = sc.l3_disk_needs(plan, used)
    assert [(n["path"], n["need_bytes"]) for n in needs] == [(L3["dir"], 30_000_000_000),
                                                           ("/var/lib/sglang/l3/two/x", 50_000_000_000)]
    assert "sglang_service_l3_max_size_gb = 50 GB" in needs[0]["what"]
    assert "sglang_service_l3_max_size_gb" in needs[0]["fix"]
    # Both on one filesystem: summed by the disk check.
    measured = [{"need": need, "free": 70_000_000_000, "mount": "/var"} for need in needs]
    (finding,) = disk.findings(measured, "h1")
    assert "has 70.0 GB free, but this run stages 80.0 GB" in finding


# After the check (service_render.CHECK_PLAYBOOK): fail with its findings, else say the L3 directory.
AFTER = FAIL_WITH_FINDINGS + """
    - name: Passed
      ansible.builtin.debug:
        msg: "L3 PASSED {{ sglang_service_plan[0].l3.dir }}"
"""


def _run(tmp_path: Path, size_gb: float):
    return run_check(tmp_path, {
        "sglang_service_platform": "none",
        "sglang_service_hicache_args": {"--enable-hierarchical-cache": True, "--hicache-size": 1},
        "sglang_service_instances": [{"name": "main", "port": 30987}],
        "sglang_service_l3_enabled": True,
        "sglang_service_l3_dir": str(tmp_path / "l3"),
        "sglang_service_l3_max_size_gb": size_gb,
    }, AFTER)


def test_a_limit_beyond_the_free_disk_is_refused_before_anything_exists(tmp_path):
    run = _run(tmp_path, 100_000_000)
    assert run.returncode != 0
    assert "the L3 tier of main (sglang_service_l3_max_size_gb = 100000000 GB" in run.stdout, run.stdout[-3000:]
    assert "lower sglang_service_l3_max_size_gb" in run.stdout
    assert "L3 PASSED" not in run.stdout
    assert not (tmp_path / "l3").exists()


def test_a_limit_that_fits_passes(tmp_path):
    run = _run(tmp_path, 0.001)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"L3 PASSED {tmp_path}/l3/main/" in run.stdout


def test_the_service_checks_include_the_tiers():
    table = json.loads((ROOT / "roles" / "sglang_service" / "files" / "sglang-flags.json").read_text())
    plan = [entry(hicache=False, l3={}, port=30987, bind="127.0.0.1", profile="p", profile_known=True, argv=[])]
    found = sc.config_findings(plan, [{"name": "main", "port": 30987}], table, {"profiles": ["p"]})
    assert any("needs HiCache" in finding for finding in found), found
