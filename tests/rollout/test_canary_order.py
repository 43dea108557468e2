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
  vars: {ansible_connection: local}
"""


def rollout_plays() -> tuple[dict, dict]:
    """The order play and the batch play of playbooks/rollout.yml, as written there."""
    plays = {play["name"]: play for play in yaml.safe_load((ROOT / "playbooks" / "rollout.yml").read_text())}
    order = plays["Rollout | the order of the hosts (the canary first)"]
    batches = plays["Rollout | gated activation, batch by batch"]
    return order, batches


def playbook() -> list[dict]:
    """The real order play, then the real batch play's hosts, serial and canary, reporting each batch."""
    order, batches = rollout_plays()
    return [
        order,
        {
            "name": "batches",
            "hosts": batches["hosts"],
            "gather_facts": False,
            "serial": batches["serial"],
            "vars": {"rollout_canary": batches["vars"]["rollout_canary"]},
            "tasks": [
                {
                    "ansible.builtin.debug": {
                        "msg": "BATCH {{ ansible_play_batch | join(',') }} CANARY {{ rollout_canary }}"
                    },
                    "run_once": True,
                }
            ],
        },
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
        if "BATCH " in line:
            hosts, canary = line.split("BATCH ", 1)[1].strip('"').split(" CANARY ")
            found.append((hosts.split(","), canary))
    return found


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
    assert batches(tmp_path, *extra) == expected
