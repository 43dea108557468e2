"""The run lock's decisions (roles/rollout/filter_plugins/rollout_lock.py): a live run refuses a
second one naming the holder; a dead pid on this controller is taken over with a warning; a lock
from elsewhere is refused with the command that breaks it."""

import base64
import json
import socket
import subprocess
from pathlib import Path

from plugins import load

ROOT = Path(__file__).resolve().parents[1]
lock = load("roles/rollout/filter_plugins/rollout_lock.py")

NOW = 1_800_000_000.0


def me() -> dict:
    record = lock.rollout_lock_record("20270115T080000Z", now=NOW)
    record["command"] = "ansible-playbook -i inventories/prod site.yml"
    return record


def other(pid: int, controller: str | None = None, age_s: float = 60, pid_start: str | None = None) -> dict:
    controller = controller or socket.gethostname()
    return {
        "owner": f"alice@{controller}",
        "controller": controller,
        "pid": pid,
        "pid_start": pid_start,
        "run_id": "20270115T075900Z",
        "started": "2027-01-15T07:59:00Z",
        "started_epoch": NOW - age_s,
    }


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def found(lock_record, where="controller") -> list[dict]:
    return [{"where": where, "path": "/x/rollout.lock", "lock": lock_record}]


def test_record_names_owner_pid_run_and_start():
    record = me()
    assert record["owner"].endswith("@" + socket.gethostname())
    assert record["run_id"] == "20270115T080000Z"
    assert record["started"] == "2027-01-15T08:00:00Z"
    assert lock.pid_alive(record["pid"], record["pid_start"])


def test_no_lock_is_free():
    decision = lock.rollout_lock_decide(found(None), me(), now=NOW)
    assert decision == {"refuse": [], "take_over": [], "replace": [], "message": ""}


def test_live_run_on_this_controller_is_refused_by_name_even_with_break():
    live = other(lock._playbook_pid())  # this very process: alive
    for breaking in (False, True):
        decision = lock.rollout_lock_decide(found(live, "rollout-1"), me(), break_lock=breaking, now=NOW)
        assert decision["take_over"] == []
        (message,) = decision["refuse"]
        assert "rollout-1 (/x/rollout.lock): locked by run 20270115T075900Z of alice@" in message
        assert "since 2027-01-15T07:59:00Z (60 s ago)" in message
        assert "still running on this controller" in message
    assert decision["message"].startswith("ROLLOUT REFUSED")


def test_dead_pid_on_this_controller_is_taken_over_with_a_warning():
    decision = lock.rollout_lock_decide(found(other(dead_pid())), me(), now=NOW)
    assert decision["refuse"] == []
    assert decision["replace"] == ["controller"]
    assert "taking over a stale lock: run 20270115T075900Z" in decision["take_over"][0]
    assert "no longer runs on this controller" in decision["message"]


def test_reused_pid_is_not_the_holder():
    """The pid runs, but it started at another time: another process, so the lock is stale."""
    live = other(lock._playbook_pid(), pid_start="1")
    assert lock.rollout_lock_decide(found(live), me(), now=NOW)["replace"] == ["controller"]


def test_other_controller_is_refused_with_the_exact_break_command():
    decision = lock.rollout_lock_decide(found(other(1234, "ops-laptop")), me(), now=NOW)
    (message,) = decision["refuse"]
    assert "locked by run 20270115T075900Z of alice@ops-laptop (pid 1234)" in message
    assert message.endswith("ansible-playbook -i inventories/prod site.yml -e rollout_lock_break=true")


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
    assert "rollout-2: unreachable" in decision["refuse"][0]
    assert "ssh: connect timed out" in decision["refuse"][0]


def test_found_decodes_slurp_results_and_is_matches_the_run():
    content = base64.b64encode(json.dumps(me()).encode()).decode()
    items = lock.rollout_lock_found(
        {"h1": {"content": content}, "h2": {"failed": False, "msg": "file not found"}, "h3": {"unreachable": True}},
        "/var/lib/hicache-fleet/rollout.lock",
    )
    assert [i["lock"] and i["lock"]["run_id"] for i in items] == ["20270115T080000Z", None, None]
    assert items[2]["unreachable"] is True
    assert lock.rollout_lock_is({"content": content}, me())
    assert not lock.rollout_lock_is({"content": content}, {**me(), "pid": 1})  # same second, other run
    assert not lock.rollout_lock_is({"content": base64.b64encode(b"garbage").decode()}, me())
    assert not lock.rollout_lock_is({"unreachable": True}, me())
