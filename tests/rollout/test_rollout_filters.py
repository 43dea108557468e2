"""The rollout role's filters: the order of a run's hosts and the host's validation record."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from plugins import load

ROOT = Path(__file__).resolve().parents[2]


def _filters():
    return load("roles/rollout/filter_plugins/rollout.py")


INVENTORY = ["a3", "a1", "a2", "c1"]  # groups['sglang_hosts']: inventory order


@pytest.mark.parametrize(
    ("play_hosts", "canary", "expected"),
    [
        (["a2", "c1", "a1", "a3"], ["c1"], ["c1", "a3", "a1", "a2"]),  # canary group first
        (["a2", "c1", "a1", "a3"], [], ["a3", "a1", "a2", "c1"]),  # no canary group: inventory order
        (["a2", "a1"], ["c1"], ["a1", "a2"]),  # --limit without the canary: first limited host leads
        (["c1", "a3"], ["c1"], ["c1", "a3"]),
    ],
)
def test_rollout_order(play_hosts, canary, expected):
    assert _filters().rollout_order(INVENTORY, play_hosts, canary) == expected


def test_rollout_record():
    f = _filters()
    assert f.rollout_record("") == {"instances": {}}
    record = {"instances": {"main": {"config_hash": "x"}}, "host_release": {"components": {}}}
    assert f.rollout_record(base64.b64encode(json.dumps(record).encode()).decode()) == record
    with pytest.raises(ValueError, match="instances"):
        f.rollout_record(base64.b64encode(b"[]").decode())


def test_rollout_plan_summary():
    f = _filters()
    assert f.rollout_plan_summary([], [], []) == "runs its validated release; nothing to restart or probe."
    assert f.rollout_plan_summary(["main"], ["main"], []) == "restart main; probe main."
    text = f.rollout_plan_summary([], ["main"], ["main"])
    assert text.startswith("restart nothing; probe main (main already run a release that was never validated")


def test_inventory_label_is_relative_only_under_the_run_directory():
    label = _filters().rollout_inventory_label
    assert label(["/src/fleet/inventories/demo"], "/src/fleet") == "inventories/demo"
    assert label(["/tmp/molecule/inventory/hosts.yml", "/src/fleet/inv"], "/src/fleet") == (
        "/tmp/molecule/inventory/hosts.yml, inv"
    )
    assert label(["/src/fleet/inv"], "") == "/src/fleet/inv"


def test_gate_verdict_is_never_passed_in_check_mode():
    r = _filters()
    """roles/rollout_gate tasks/main.yml: the verdict a gated host's report carries."""
    assert r.rollout_gate_verdict([], False) == "unchanged"
    assert r.rollout_gate_verdict([], True) == "unchanged"
    assert r.rollout_gate_verdict([{"name": "main"}], False) == "passed"
    assert r.rollout_gate_verdict([{"name": "main"}], True) == "would be probed (check mode)"


def test_gate_note_names_the_instances_running_an_unvalidated_release():
    r = _filters()
    assert r.rollout_gate_unvalidated_note([], False) == ""
    assert r.rollout_gate_unvalidated_note(["main", "draft"], False) == (
        "main, draft found running a release this host never validated; probed now without a restart: passed")
    assert r.rollout_gate_unvalidated_note(["main"], True) == (
        "main found running a release this host never validated; it would be probed (check mode)")
