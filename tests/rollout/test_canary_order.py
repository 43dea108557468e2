"""The order in which the rollout visits hosts, through the real task file (roles/rollout
tasks/order.yml) on the example inventory's layout: the sglang_canary group first, then inventory
order; under --limit, only the limited hosts, and the first of them leads when the canary is out."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

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

# The same two plays as playbooks/rollout.yml: order, then batches on _rollout_order (one host each).
PLAYBOOK = """\
- hosts: sglang_hosts
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: rollout
        tasks_from: order
        apply: {run_once: true}
      run_once: true
- hosts: _rollout_order
  gather_facts: false
  serial: [1, 1, 1, 1]
  tasks:
    - ansible.builtin.debug:
        msg: "VISIT {{ inventory_hostname }}"
"""


def visits(tmp_path: Path, *extra: str) -> list[str]:
    (tmp_path / "inv.yml").write_text(INVENTORY)
    (tmp_path / "pb.yml").write_text(PLAYBOOK)
    out = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(tmp_path / "inv.yml"), str(tmp_path / "pb.yml"), *extra],
        capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
             "ANSIBLE_NOCOLOR": "1"},
    )
    return [line.split("VISIT ", 1)[1].strip('"') for line in out.stdout.splitlines() if "VISIT " in line]


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        ([], ["c1", "a1", "a2", "a3"]),
        (["--limit", "a3,a1"], ["a1", "a3"]),
        (["--limit", "a2,c1"], ["c1", "a2"]),
    ],
)
def test_the_canary_leads_and_limit_cuts(tmp_path, limit, expected):
    assert visits(tmp_path, *limit) == expected
