"""The entry points snapshot and restore (playbooks/ab_benchmark.yml's way to put an instance back): what
they refuse before changing anything. Their whole path (a snapshot of a serving release, two launches, the
restore, the host read back) runs in molecule/ab_benchmark on real systemd test hosts."""

from __future__ import annotations

from service_render import run_playbook

RESTORE = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Restore
      ansible.builtin.include_role: {name: sglang_service, tasks_from: restore}
"""

SNAPSHOT = RESTORE.replace("tasks_from: restore", "tasks_from: snapshot").replace("name: Restore", "name: Snapshot")


def test_restore_refuses_check_mode_before_it_copies_anything(tmp_path):
    kept, release = tmp_path / "kept", tmp_path / "release"
    kept.mkdir()
    (kept / "unit").write_text("kept\n")
    release.mkdir()
    (release / "unit").write_text("live\n")
    snapshot = {"kept_dir": str(kept), "release_dir": str(release), "name": "main", "unit": "sglang-main.service"}
    run = run_playbook(tmp_path, RESTORE, {"sglang_service_snapshot": snapshot}, "--check")
    assert run.returncode == 2, run.stdout[-3000:]
    assert "check mode cannot show that: run it without --check. Nothing was changed." in " ".join(run.stdout.split())
    assert (release / "unit").read_text() == "live\n"  # the copy back did not happen


def test_restore_without_a_snapshot_says_to_take_one(tmp_path):
    run = run_playbook(tmp_path, RESTORE, {"sglang_service_snapshot": {"name": "main"}})
    assert run.returncode == 2, run.stdout[-3000:]
    assert "take a snapshot first (tasks_from: snapshot)" in " ".join(run.stdout.split())


def test_snapshot_of_an_instance_without_a_release_changes_nothing(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    run = run_playbook(tmp_path, SNAPSHOT, {"sglang_service_snapshot_instance": "main",
                                            "sglang_service_state_dir": str(state)})
    assert run.returncode == 2, run.stdout[-3000:]
    assert f"has no current release of instance main ({state}/main/current is not a link" in " ".join(
        run.stdout.split())
    assert list(state.iterdir()) == []  # no copy, no directory
