"""A rollout host that stops because a new amdgpu driver waits for a reboot (rocm_reboot false) says so in
the run report. Real Ansible on localhost: the note task of roles/rollout_gate/tasks/rollback.yml ("nothing of the
service was changed on this host"), as written there, then the role's real tasks/report.yml, which writes
<run dir>/hosts/<host>.json and renders rollout.md and rollout.json with files/fleet_report.py. The reason of
the reboot case is the real fail message of roles/rocm/tasks/service_ready.yml, rendered by Ansible."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"

NOTE_TASK = "Rollback | nothing of the service was changed on this host"
REBOOT_TASK = "Refuse to start the service before the reboot"
# What the rocm handler marks the host with by default (roles/rocm/handlers/main.yml).
REBOOT_MARK = "the amdgpu kernel driver changed"
OTHER_REASON = "Could not download the model revision: HTTP Error 503: Service Unavailable"


def task_named(path: str, name: str) -> dict:
    [task] = [task for task in yaml.safe_load((ROOT / path).read_text()) if task.get("name") == name]
    return task


def playbook(run_dir: Path, pending: bool, reason: str) -> list[dict]:
    return [
        {
            "name": "a host whose rollout stopped before anything of the service changed",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {
                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                "rollout_run_dir": str(run_dir),
                "rocm_reboot_pending": pending,
                "_rocm_reboot_reason": REBOOT_MARK,
                "_rollout_gate_changed_here": False,
                "_rollout_gate_rollback": [],
            },
            "tasks": [
                task_named("roles/rollout_gate/tasks/rollback.yml", NOTE_TASK),
                {
                    "name": "report this host as rollback.yml does",
                    "ansible.builtin.include_role": {"name": "rollout", "tasks_from": "report"},
                    "vars": {
                        "_rollout_gate_verdict": "failed",
                        "_rollout_gate_probes": [],
                        "_rollout_gate_reasons": [reason],
                    },
                },
            ],
        }
    ]


def run_rollout_report(tmp_path: Path, pending: bool, reason: str) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "hosts").mkdir(parents=True)
    # As roles/rollout/tasks/open.yml writes it (no lock: the outcome callback leaves this run alone).
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": "20250101T000000Z",
        "inventory": "inventories/test",
        "hosts": ["localhost"],
        "check_mode": False,
        "note": "",
        "lock": {},
        "lock_paths": {},
        "lock_warnings": [],
        "report_command": [str(BIN / "python"), str(ROOT / "roles/rollout/files/fleet_report.py"), "rollout"],
    }))
    (tmp_path / "pb.yml").write_text(yaml.safe_dump(playbook(run_dir, pending, reason), sort_keys=False))
    out = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", str(tmp_path / "pb.yml")],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
             "ANSIBLE_NOCOLOR": "1"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return run_dir


REBOOT_NOTE_PARTS = ("a new amdgpu driver is installed and waits for a reboot", "rocm_reboot is false",
                     "the service was not restarted", "serves what it served before", "reboot the host")
BEFORE_ANY_CHANGE = "the failure came before any change on this host"


@pytest.mark.parametrize("pending", [True, False], ids=["reboot-pending", "no-reboot-pending"])
def test_the_report_says_the_host_waits_for_a_reboot(tmp_path, pending):
    reason = task_named("roles/rocm/tasks/service_ready.yml", REBOOT_TASK)["ansible.builtin.fail"]["msg"]
    run_dir = run_rollout_report(tmp_path, pending, reason if pending else OTHER_REASON)

    record = json.loads((run_dir / "hosts" / "localhost.json").read_text())
    assert record["verdict"] == "failed"
    note = record["note"]
    if pending:
        [rendered] = record["reasons"]
        assert rendered.startswith(f"localhost waits for a reboot: {REBOOT_MARK}, and rocm_reboot is false")
        for part in REBOOT_NOTE_PARTS:
            assert part in note
        assert BEFORE_ANY_CHANGE not in note
    else:
        assert record["reasons"] == [OTHER_REASON]
        assert note == f"{BEFORE_ANY_CHANGE}; it serves what it served before"

    md = (run_dir / "rollout.md").read_text()
    # The Notes section: the reason, then the note, each on its own line (the reboot reason itself also
    # says "waits for a reboot", so the note's line is checked on its own).
    notes = [line for line in md.splitlines() if line.startswith("- **localhost**: ")]
    assert notes == [f"- **localhost**: {record['reasons'][0]}", f"- **localhost**: {note}"]
    note_line = notes[1]
    if pending:
        assert "waits for a reboot" in note_line
        assert "serves what it served before" in note_line
        assert "the failure came before any change" not in md
    else:
        assert BEFORE_ANY_CHANGE in note_line
        assert "waits for a reboot" not in md
    assert "| localhost | failed |" in md

    verdict = json.loads((run_dir / "rollout.json").read_text())["run"]["verdict"]
    assert "every host passed" not in verdict
    assert verdict == "halted: localhost failed"
    assert f"verdict: **{verdict}**" in md
