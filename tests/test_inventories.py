"""The shipped inventories parse and define the sglang_hosts group the playbooks target."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"


def inventory(name: str) -> dict:
    out = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", str(ROOT / "inventories" / name), "--list"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
    )
    return json.loads(out.stdout)


def hosts_of(inv: dict, group: str) -> set[str]:
    found = set(inv.get(group, {}).get("hosts", []))
    for child in inv.get(group, {}).get("children", []):
        found |= hosts_of(inv, child)
    return found


@pytest.mark.parametrize(("name", "count"), [("example", 6), ("demo", 3)])
def test_inventory_has_sglang_hosts(name, count):
    assert len(hosts_of(inventory(name), "sglang_hosts")) == count


def test_demo_hosts_stay_on_loopback():
    inv = inventory("demo")
    for host in hosts_of(inv, "sglang_hosts"):
        assert inv["_meta"]["hostvars"][host]["ansible_host"].startswith("127.")
