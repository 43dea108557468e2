"""The canary and the batches of a rollout, with and without --limit: the order play and the batch
play's `serial` and `rollout_canary` are taken from the real playbooks/rollout.yml (the order play
runs roles/rollout tasks/order.yml), run on the example inventory's layout (an sglang_canary group
and three other hosts). What roles/rollout/README.md says about --limit is what these check:
the sglang_canary hosts first, then inventory order; under --limit, only the limited hosts, batch
sizes (percentages too) counted over them, and the first of them is the canary when the limit
leaves every sglang_canary host out."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"

INVENTORY = """\
sglang_hosts:
  children:
    sglang_fleet:
      hosts: {a1: {}, a2: {}, a3: {}}
    sglang_canary:
      hosts: {c1: {}}
  vars: {ansible_connection: local, rollout_gate_leaving: [main]}
"""


def rollout_plays() -> tuple[dict, dict, dict, dict]:
    """The order, stage, unchanged and batch plays of playbooks/rollout.yml, as written there."""
    plays = {play["name"]: play for play in yaml.safe_load((ROOT / "playbooks" / "rollout.yml").read_text())}
    order = plays["Rollout | the order of the hosts (the canary first)"]
    stage = plays["Rollout | stage every host's release (in parallel; nothing live changes)"]
    unchanged = plays["Rollout | the hosts that do not change, all at once"]
    batches = plays["Rollout | gated activation of the hosts that change, batch by batch"]
    return order, stage, unchanged, batches


def playbook() -> list[dict]:
    """The real order play; the stage play's hosts with its real split into the hosts that change
    (here: those whose inventory says rollout_gate_leaving, as tasks/plan.yml would find them) and those
    that do not; then the unchanged play's hosts and the real batch play's hosts, serial and canary,
    reporting each batch."""
    order, stage, unchanged, batches = rollout_plays()
    [classify] = [task for task in stage["tasks"]
                  if task.get("ansible.builtin.include_role", {}).get("tasks_from") == "classify"]

    def report(play: dict, what: str, **keywords) -> dict:
        return {
            "name": what,
            "hosts": play["hosts"],
            "gather_facts": False,
            **keywords,
            "vars": {"rollout_canary": batches["vars"]["rollout_canary"]},
            "tasks": [
                {
                    "ansible.builtin.debug": {
                        "msg": what + " {{ ansible_play_batch | join(',') }} CANARY {{ rollout_canary }}"
                    },
                    "run_once": True,
                }
            ],
        }

    return [
        order,
        {"name": "stage", "hosts": stage["hosts"], "gather_facts": False, "tasks": [classify]},
        report(unchanged, "UNCHANGED"),
        report(batches, "BATCH", serial=batches["serial"]),
    ]


def batches(tmp_path: Path, *extra: str) -> list[tuple[list[str], str]]:
    """The batches the rollout would visit, each with the host it probes as the canary."""
    (tmp_path / "inv.yml").write_text(INVENTORY)
    (tmp_path / "pb.yml").write_text(yaml.safe_dump(playbook(), sort_keys=False))
    out = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(tmp_path / "inv.yml"), str(tmp_path / "pb.yml"), *extra],
        capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
             "ANSIBLE_NOCOLOR": "1"},
    )
    found = []
    for line in out.stdout.splitlines():
        for what in ("UNCHANGED ", "BATCH "):
            if what in line and "msg" in line:
                hosts, canary = line.split(what, 1)[1].rstrip().rstrip("'\"").split(" CANARY")
                found.append((what.strip(), hosts.split(","), canary.strip()))
    return found


def batches_of(found: list[tuple[str, list[str], str]]) -> list[tuple[list[str], str]]:
    return [(hosts, canary) for what, hosts, canary in found if what == "BATCH"]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        # The default batches [1, "25%", "100%"] over four hosts: the canary alone, one, the rest.
        ([], [(["c1"], "c1"), (["a1"], "c1"), (["a2", "a3"], "c1")]),
        # --limit keeps inventory order whatever order it names hosts in; without an sglang_canary
        # host, the first limited host in inventory order is the canary.
        (["--limit", "a3,a1"], [(["a1"], "a1"), (["a3"], "a1")]),
        # A limit that includes the canary group's host: it still leads.
        (["--limit", "a2,c1"], [(["c1"], "c1"), (["a2"], "c1")]),
        # Batch sizes count the limited hosts only: "100%" of the three left after the canary.
        (["--limit", "a1,a2,a3", "-e", '{"rollout_batches": [1, "100%"]}'], [(["a1"], "a1"), (["a2", "a3"], "a1")]),
        # A single limited host is its own canary batch.
        (["--limit", "a2"], [(["a2"], "a2")]),
    ],
)
def test_the_canary_leads_and_limit_cuts_the_batches(tmp_path, extra, expected):
    found = batches(tmp_path, *extra)
    assert batches_of(found) == expected
    assert [what for what, _, _ in found if what == "UNCHANGED"] == []


@pytest.mark.parametrize(
    ("unchanged", "extra", "expected_batches", "expected_unchanged"),
    [
        # The canary host does not change: it is verified with the other unchanged hosts at once,
        # and the first host that changes leads the batches alone. The canary's prompt length stays
        # with the canary host (it is not probed in this run).
        (["c1"], [], [(["a1"], "c1"), (["a2"], "c1"), (["a3"], "c1")], ["c1"]),
        # One host of four changes: it alone is batched; the other three are never in a batch.
        (["c1", "a1", "a3"], [], [(["a2"], "c1")], ["c1", "a1", "a3"]),
        # Nothing changes: no batch at all.
        (["c1", "a1", "a2", "a3"], [], [], ["c1", "a1", "a2", "a3"]),
        # Batch sizes count the hosts that change only.
        (["a1"], ["-e", '{"rollout_batches": [1, "100%"]}'], [(["c1"], "c1"), (["a2", "a3"], "c1")], ["a1"]),
    ],
)
def test_only_the_hosts_that_change_are_batched(tmp_path, unchanged, extra, expected_batches, expected_unchanged):
    host_vars = tmp_path / "host_vars"
    host_vars.mkdir()
    for host in unchanged:
        (host_vars / f"{host}.yml").write_text("rollout_gate_leaving: []\n")
    found = batches(tmp_path, *extra)
    assert batches_of(found) == expected_batches
    unchanged_plays = [(hosts, canary) for what, hosts, canary in found if what == "UNCHANGED"]
    if expected_unchanged:
        assert unchanged_plays == [(expected_unchanged, "c1")]
    else:
        assert unchanged_plays == []
