"""The run's outcome names only the host locks this run took and did not release. A host site.yml
skipped as converged takes no lock (run.json lists it under "hosts" for the report, not under
"locked"), so it must never be reported as a lock left behind; a locked host whose unlock did not run
must be. The real callback_plugins/rollout_outcome.py, fed the events Ansible gives it: the fact that
names the run directory, the unlock task's item results, and the run's stats."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


def callback_module():
    spec = importlib.util.spec_from_file_location("rollout_outcome", ROOT / "callback_plugins" / "rollout_outcome.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Stats:
    """What the callback reads of Ansible's AggregateStats: a summary per host."""

    def summarize(self, host: str) -> dict:
        return {"unreachable": 0, "failures": 0}


def finish(tmp_path: Path, hosts: list[str], locked: list[str] | None, released: list[str]) -> dict:
    module = callback_module()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = {"run_id": "r1", "hosts": hosts, "lock": {"run_id": "r1", "controller": "c", "pid": os.getpid()},
           "lock_paths": {"controller": str(tmp_path / "controller.lock")}, "check_mode": False}
    if locked is not None:
        run["locked"] = locked
    (run_dir / "run.json").write_text(json.dumps(run))
    (tmp_path / "controller.lock").write_text(json.dumps(run["lock"]))
    callback = module.CallbackModule()
    callback.v2_runner_on_ok(SimpleNamespace(_result={"ansible_facts": {"rollout_run_dir": str(run_dir)}}))
    for host in released:
        callback.v2_runner_item_on_ok(SimpleNamespace(_task=SimpleNamespace(name=module._UNLOCK_TASK),
                                                      _result={"item": {"item": host}}))
    callback.v2_playbook_on_stats(Stats())
    return json.loads((run_dir / "outcome.json").read_text())


def test_converged_hosts_took_no_lock_and_are_not_left(tmp_path: Path) -> None:
    outcome = finish(tmp_path, ["h1", "h2", "h3"], locked=["h2"], released=["h2"])
    assert outcome["locks"] == {"controller_released_at_end": True, "left": []}
    assert not (tmp_path / "controller.lock").exists()


def test_a_locked_host_never_unlocked_is_left(tmp_path: Path) -> None:
    outcome = finish(tmp_path, ["h1", "h2", "h3"], locked=["h1", "h2"], released=["h2"])
    assert outcome["locks"]["left"] == ["h1"]


@pytest.mark.parametrize(("released", "left"), [([], ["h1", "h2"]), (["h1"], ["h2"])])
def test_a_run_json_without_the_list_counts_every_host(tmp_path: Path, released: list[str], left: list[str]) -> None:
    assert finish(tmp_path, ["h1", "h2"], locked=None, released=released)["locks"]["left"] == left
