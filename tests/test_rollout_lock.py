"""The run lock's decisions (roles/rollout/filter_plugins/rollout_lock.py): a live run refuses a
second one naming the holder; a dead pid on this controller is taken over with a warning; a lock
from elsewhere is refused with the command that breaks it."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from plugins import load

ROOT = Path(__file__).resolve().parents[1]
lock = load("roles/rollout/filter_plugins/rollout_lock.py")

NOW = 1_800_000_000.0


def me() -> dict:
    record = lock.rollout_lock_record("20270115T080000Z", now=NOW)
    record["playbooks"] = ["site.yml"]
    return record


def other(pid: int, controller: str | None = None, age_s: float = 60, pid_start: str | None = None) -> dict:
    """A lock of another run: from this controller (its controller id) unless `controller` names another."""
    return {
        "owner": f"alice@{controller or socket.gethostname()}",
        "controller": controller or socket.gethostname(),
        "controller_id": "0" * 32 if controller else lock.controller_id(),
        "pid": pid,
        "pid_start": pid_start,
        "run_id": "20270115T075900Z",
        "started": "2027-01-15T07:59:00Z",
        "started_epoch": int(NOW - age_s),
        "playbooks": ["site.yml"],
    }


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def found(lock_record, where="controller") -> list[dict]:
    kind = "controller" if where == "controller" else "host"
    return [{"kind": kind, "where": where, "path": "/x/rollout.lock", "lock": lock_record}]


def test_record_names_owner_pid_run_and_start():
    record = me()
    assert record["owner"].endswith("@" + socket.gethostname())
    assert record["run_id"] == "20270115T080000Z"
    assert record["started"] == "2027-01-15T08:00:00Z"
    assert lock.pid_alive(record["pid"], record["pid_start"])


def test_no_lock_is_free():
    decision = lock.rollout_lock_decide(found(None), me(), now=NOW)
    assert decision == {"refuse": [], "take_over": [], "replace": {"controller": None, "hosts": {}}, "message": ""}


def test_live_run_on_this_controller_is_refused_by_name_even_with_break():
    live = other(lock._playbook_pid())  # this very process: alive
    for breaking in (False, True):
        decision = lock.rollout_lock_decide(found(live, "rollout-1"), me(), break_lock=breaking, now=NOW)
        assert decision["take_over"] == []
        (message,) = decision["refuse"]
        assert "host rollout-1 (/x/rollout.lock): locked by run 20270115T075900Z of alice@" in message
        assert "site.yml), since 2027-01-15T07:59:00Z (60 s ago)" in message
        assert "still running on this controller" in message
    assert decision["message"].startswith("ROLLOUT REFUSED")


def test_dead_pid_on_this_controller_is_taken_over_with_a_warning():
    decision = lock.rollout_lock_decide(found(other(dead_pid())), me(), now=NOW)
    assert decision["refuse"] == []
    assert decision["replace"]["controller"]["run_id"] == "20270115T075900Z"
    assert decision["replace"]["hosts"] == {}
    assert "taking over a stale lock: run 20270115T075900Z" in decision["take_over"][0]
    assert "no longer runs on this controller" in decision["message"]


def test_reused_pid_is_not_the_holder():
    """The pid runs, but it started at another time: another process, so the lock is stale."""
    live = other(lock._playbook_pid(), pid_start="1")
    assert lock.rollout_lock_decide(found(live), me(), now=NOW)["replace"]["controller"]["pid_start"] == "1"


def test_other_controller_is_refused_with_the_exact_break_command():
    decision = lock.rollout_lock_decide(found(other(1234, "ops-laptop")), me(), now=NOW)
    (message,) = decision["refuse"]
    assert "locked by run 20270115T075900Z of alice@ops-laptop (pid 1234, site.yml)" in message
    assert message.endswith("ansible-playbook <your options> site.yml -e rollout_lock_break=true")


def test_old_lock_from_elsewhere_is_called_stale_and_still_needs_the_break():
    old = other(1234, "ops-laptop", age_s=7 * 3600)
    decision = lock.rollout_lock_decide(found(old), me(), stale_after_s=6 * 3600, now=NOW)
    (message,) = decision["refuse"]
    assert "stale lock of run 20270115T075900Z" in message
    assert "(7.0 h ago)" in message
    assert "rollout_lock_stale_after_s=21600" in message
    broken = lock.rollout_lock_decide(found(old), me(), stale_after_s=6 * 3600, break_lock=True, now=NOW)
    assert broken["refuse"] == []
    assert "breaking the lock of run 20270115T075900Z" in broken["take_over"][0]


def test_unreachable_host_refuses_the_run():
    decision = lock.rollout_lock_decide(
        [{"where": "rollout-2", "lock": None, "unreachable": True, "error": "ssh: connect timed out"}], me(), now=NOW
    )
    assert "host rollout-2: unreachable" in decision["refuse"][0]
    assert "ssh: connect timed out" in decision["refuse"][0]


def test_record_holds_no_command_line_only_the_playbooks_names(monkeypatch):
    """A secret passed with -e must never land in a lock: the record is these keys, nothing else."""
    monkeypatch.setattr(sys, "argv", ["ansible-playbook", "site.yml", "-e", "sglang_service_api_key=sk-SECRET"])
    record = lock.rollout_lock_record("20270115T080000Z", now=NOW)
    assert set(record) == {"owner", "controller", "controller_id", "pid", "pid_start", "run_id", "started",
                           "started_epoch", "playbooks"}
    assert "SECRET" not in json.dumps(record)


def test_two_containers_named_alike_are_two_controllers(monkeypatch):
    """Same host name, same machine id and boot id (one kernel): the pid namespace tells them apart."""
    here = lock.controller_id()
    monkeypatch.setattr(lock.os, "readlink", lambda path: "pid:[4026599999]")
    assert lock.controller_id() != here
    # A live run of the other container is not taken over (its pid cannot be checked from here).
    theirs = {**other(dead_pid()), "controller_id": here}
    decision = lock.rollout_lock_decide(found(theirs), me(), now=NOW)
    assert decision["take_over"] == []
    assert "break the lock with: ansible-playbook <your options> site.yml -e rollout_lock_break=true" in (
        decision["refuse"][0]
    )


def test_a_host_named_controller_is_not_the_controller():
    stale = other(dead_pid())
    items = [{"kind": "host", "where": "controller", "path": "/var/lib/hicache-fleet/rollout.lock", "lock": stale}]
    decision = lock.rollout_lock_decide(items, me(), now=NOW)
    assert decision["replace"]["controller"] is None
    assert decision["replace"]["hosts"]["controller"]["pid"] == stale["pid"]
    assert lock.rollout_lock_replacing(decision, "controller") is None
    assert lock.rollout_lock_replacing(decision, "host", "controller")["run_id"] == stale["run_id"]
    assert "host controller (/var/lib/hicache-fleet/rollout.lock): taking over" in decision["take_over"][0]


def test_a_file_that_is_not_a_lock_is_refused_without_its_content():
    items = lock.rollout_lock_found({"h1": {"lock": None, "invalid": "it is not JSON"}}, "/var/lib/hicache-fleet/x")
    decision = lock.rollout_lock_decide(items, me(), now=NOW)
    (message,) = decision["refuse"]
    assert "host h1 (/var/lib/hicache-fleet/x): the file is not a run lock of hicache-fleet (it is not JSON)" in message
    assert "its content is not shown" in message


STATE = "/var/lib/hicache-fleet"
DEFAULTS = {"rollout_lock_path": f"{STATE}/rollout.lock", "rollout_record_path": f"{STATE}/validated.json",
            "rollout_converged_path": f"{STATE}/converged.json"}


def test_default_paths_pass():
    assert lock.rollout_lock_paths_problems({"h1": DEFAULTS}, "/srv/inv/reports/rollout/rollout.lock",
                                            "/srv/inv/reports/rollout") == []


@pytest.mark.parametrize("value", ["/etc/shadow", f"{STATE}/../../etc/shadow", f"{STATE}/", f"{STATE}",
                                   f"{STATE}/a/.hidden", f"{STATE}/ok.lock\n/etc/shadow", "var/lib/hicache-fleet/x",
                                   f"{STATE}x/rollout.lock"])
def test_host_paths_outside_the_state_dir_are_refused_naming_the_variable(value):
    paths = {"h1": {**DEFAULTS, "rollout_lock_path": value}, "h2": DEFAULTS}
    (problem,) = lock.rollout_lock_paths_problems(paths, "/r/rollout.lock", "/r")
    assert problem.startswith(f"rollout_lock_path={value!r} is refused: it must be a file under {STATE}/")
    assert "Set rollout_lock_path to such a path" in problem
    assert problem.endswith("(hosts: h1)")


def test_record_paths_are_checked_too():
    paths = {"h1": {**DEFAULTS, "rollout_record_path": "/root/.ssh/authorized_keys"}}
    (problem,) = lock.rollout_lock_paths_problems(paths, "/r/rollout.lock", "/r")
    assert problem.startswith("rollout_record_path='/root/.ssh/authorized_keys' is refused")


@pytest.mark.parametrize("value", ["/etc/passwd", "/r/../etc/passwd", "/r", "/r/", "/rr/rollout.lock", "rollout.lock"])
def test_controller_lock_outside_the_report_dir_is_refused(value):
    (problem,) = lock.rollout_lock_paths_problems({"h1": DEFAULTS}, value, "/r")
    assert problem.startswith(f"rollout_lock_controller_path={value!r} is refused: it must be a file in "
                              "rollout_report_dir (/r, an absolute path)")


# library/fleet_run_lock.py, called as Ansible calls it on a host (its functions, on tmp_path).
mod = load("library/fleet_run_lock.py")


def record(run_id="20270115T080000Z", pid=4242) -> dict:
    return {**other(pid), "run_id": run_id}


def test_take_writes_the_record_0600_and_a_second_take_fails(tmp_path):
    path = str(tmp_path / "state" / "rollout.lock")
    mine = record()
    mod.take(path, mine, None)
    assert json.loads(Path(path).read_text()) == mine
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["rollout.lock"]
    with pytest.raises(mod.LockError, match="another run took the lock meanwhile"):
        mod.take(path, record("20270115T080001Z", 4343), None)
    assert json.loads(Path(path).read_text()) == mine


def test_a_stale_lock_is_won_by_one_run_only(tmp_path):
    """Two runs decided the same stale lock: the first replaces it, the second finds it changed."""
    path = str(tmp_path / "rollout.lock")
    stale = record("20270115T070000Z", 1111)
    mod.take(path, stale, None)
    first, second = record("20270115T080000Z", 2222), record("20270115T080000Z", 3333)
    mod.take(path, first, stale)
    with pytest.raises(mod.LockError, match="the lock changed since it was read"):
        mod.take(path, second, stale)
    assert json.loads(Path(path).read_text())["pid"] == 2222
    # While a takeover is under way (its mutex exists) no other run takes it over.
    Path(path + ".takeover").write_text("")
    with pytest.raises(mod.LockError, match="another run is taking over this lock at this moment"):
        mod.take(path, second, first)
    assert json.loads(Path(path).read_text())["pid"] == 2222


@pytest.mark.parametrize(("content", "why"), [
    ("root:$6$SHADOWHASH:19000:0:99999:7:::\n", "it is not JSON"),
    ('{"secret": "SHADOWHASH"}', "key(s) missing"),
    (json.dumps({**other(1), "pid": "SHADOWHASH"}), "key pid has the wrong type"),
    (json.dumps({**other(1), "command": "ansible-playbook -e k=SHADOWHASH"}), "1 unknown key(s)"),
])
def test_read_refuses_a_foreign_file_without_its_content(tmp_path, content, why):
    path = tmp_path / "rollout.lock"
    path.write_text(content)
    held, invalid = mod.read_lock(str(path))
    assert held is None
    assert invalid.startswith(why)
    assert "SHADOWHASH" not in invalid


def test_read_never_follows_a_symlink(tmp_path):
    (tmp_path / "target").write_text(json.dumps(other(1)))
    (tmp_path / "rollout.lock").symlink_to(tmp_path / "target")
    assert mod.read_lock(str(tmp_path / "rollout.lock")) == (None, "it is a symlink")
