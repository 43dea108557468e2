"""The run lock as Ansible runs it: roles/rollout's `open` (path checks, lock.yml, run.json) on
localhost (connection local, the hosts' state directory in tmp_path), with callback_plugins/
rollout_outcome.py finishing the report. A secret passed with -e is in no file the run writes (the
locks, run.json, outcome.json, rollout.json, rollout.md) and in no refusal; the files are 0600; a
stale lock is taken over, a live one refused; a lock path outside the state directory is refused
before anything is read, also under --check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-LOCKTEST-7f3a9c"  # noqa: S105 - a test value, to be found in no file

PLAYBOOK = """
- name: Open a run as playbooks/rollout.yml does
  hosts: sglang_hosts
  gather_facts: false
  tasks:
    - name: Open
      ansible.builtin.include_role: {name: rollout, tasks_from: open}
"""


def ansible(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    state, reports = tmp_path / "state", tmp_path / "reports"
    (tmp_path / "site.yml").write_text(PLAYBOOK, encoding="utf-8")
    inventory = {"sglang_hosts": {"hosts": {"node-1": {
        "ansible_connection": "local", "ansible_host": "127.0.0.1", "ansible_python_interpreter": sys.executable}}}}
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory), encoding="utf-8")
    variables = {
        "_rollout_host_state_dir": str(state),
        "rollout_lock_path": f"{state}/rollout.lock",
        "rollout_record_path": f"{state}/validated.json",
        "rollout_converged_path": f"{state}/converged.json",
        "rollout_report_dir": str(reports),
    }
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FACT_CACHING="memory")
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
         str(tmp_path / "site.yml"), "-e", json.dumps(variables),
         "-e", f"sglang_service_api_key={SECRET}", "-e", f"models_hf_token={SECRET}", *extra],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )


def written(tmp_path: Path) -> list[Path]:
    return sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.name not in ("site.yml", "hosts.yml"))


def pid_start(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def test_no_secret_in_any_file_and_files_0600_then_stale_taken_over_live_refused(tmp_path: Path) -> None:
    first = ansible(tmp_path)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    host_lock = tmp_path / "state" / "rollout.lock"
    (run_dir,) = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    files = written(tmp_path)
    names = {p.name for p in files}
    assert {"rollout.lock", "run.json", "outcome.json", "rollout.json", "rollout.md"} <= names, names
    for path in files:
        assert SECRET not in path.read_text(errors="replace"), path
    for path in (host_lock, run_dir / "run.json", run_dir / "outcome.json", run_dir / "rollout.json"):
        assert oct(path.stat().st_mode & 0o777) == "0o600", path
    held = json.loads(host_lock.read_text())
    assert held["playbooks"] == ["site.yml"]
    assert set(held) == {"owner", "controller", "controller_id", "pid", "pid_start", "run_id", "started",
                         "started_epoch", "playbooks"}
    # The run ended without its summary play: the host's lock is left (its pid is gone), the
    # controller's was released by the callback.
    assert not (tmp_path / "reports" / "rollout.lock").exists()

    second = ansible(tmp_path)
    assert second.returncode == 0, second.stdout[-4000:]
    assert f"host node-1 ({host_lock}): taking over a stale lock: run {held['run_id']}" in second.stdout
    assert json.loads(host_lock.read_text())["run_id"] != held["run_id"] or json.loads(host_lock.read_text())[
        "pid"] != held["pid"]

    # A live run on this controller (this very test process) holds it: refused, no secret shown.
    live = {**held, "pid": os.getpid(), "pid_start": pid_start(os.getpid()), "run_id": "20270101T000000Z"}
    host_lock.write_text(json.dumps(live))
    third = ansible(tmp_path)
    assert third.returncode != 0
    assert "ROLLOUT REFUSED" in third.stdout
    assert f"locked by run 20270101T000000Z of {held['owner']} (pid {os.getpid()}, site.yml)" in third.stdout
    assert "still running on this controller" in third.stdout
    assert SECRET not in third.stdout + third.stderr
    assert json.loads(host_lock.read_text()) == live


def test_a_foreign_lock_file_is_refused_without_showing_it(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "rollout.lock").write_text("root:$6$NOTSHOWN:19000:0:99999:7:::\n")
    run = ansible(tmp_path)
    assert run.returncode != 0
    assert "the file is not a run lock of hicache-fleet (it is not JSON); its content is not shown" in run.stdout
    assert "NOTSHOWN" not in run.stdout + run.stderr
    assert (tmp_path / "state" / "rollout.lock").read_text().startswith("root:")


@pytest.mark.parametrize("check", [[], ["--check"]])
def test_a_lock_path_outside_the_state_dir_is_refused_before_anything_is_read(tmp_path: Path, check) -> None:
    outside = tmp_path / "shadow"
    outside.write_text("root:$6$NOTSHOWN:19000:0:99999:7:::\n")
    run = ansible(tmp_path, "-e", f"rollout_lock_path={outside}", *check)
    assert run.returncode != 0
    assert f"rollout_lock_path='{outside}' is refused: it must be a file under {tmp_path / 'state'}/" in run.stdout
    assert "NOTSHOWN" not in run.stdout + run.stderr
    assert outside.read_text().startswith("root:")
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())
