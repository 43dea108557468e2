#!/usr/bin/env python3
"""The demo fleet's hosts beyond inventories/demo/hosts.yml's three (`make demo DEMO_HOSTS=N`):
demo-4..demo-N on 127.0.30.4..N, written as a second inventory source that scripts/demo.sh and
benchmarks/fleet_scale.py pass after `-i inventories/demo`. Generated per run into a git-ignored
place (.cache/demo/hosts-extra.yml), never an edit of the committed inventory.

What the three get, the extra hosts get: they join the group sglang_hosts, so the group's variables
in hosts.yml and inventories/demo/group_vars/sglang_hosts/ apply to them (Ansible reads the
group_vars beside every inventory source for every host of the group, whichever source named the
host); per host, each has its own ansible_host, as the three have. And each has
inventory_dir set to inventories/demo: Ansible sets inventory_dir to the directory of the source
that named a host, and the demo's settings resolve paths from it (the SSH key and the controller
cache `{{ inventory_dir }}/../../.cache`, the run reports and the controller's run lock
`{{ inventory_dir }}/reports/rollout`), so an extra host resolves every one of them as the three do
and a run limited to extra hosts still reports and locks beside inventories/demo.

    demo_inventory.py N OUT      write the extra hosts of a demo fleet of N (1..40) to OUT
                                 (N <= 3: no extra host; OUT is removed)
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO_INVENTORY = ROOT / "inventories" / "demo"
# inventories/demo/hosts.yml: demo-1..3 on 127.0.30.1-3. The block is 127.0.30.0/24
# (molecule/resources/README.md, "Address blocks").
STATIC_HOSTS = 3
MAX_HOSTS = 40
ADDRESS = "127.0.30.{}"

HEADER = """\
# Written by scripts/demo_inventory.py for a demo fleet of {n} hosts (make demo DEMO_HOSTS={n});
# the next `make demo` rewrites it, `make demo-down` removes it. Not an inventory to edit: the three
# of inventories/demo/hosts.yml and its group_vars are the demo's settings. Passed after
# `-i inventories/demo`; inventory_dir makes these hosts resolve the demo's paths as the three do.
"""


def host_count(value: str | int) -> int:
    """The fleet size N of DEMO_HOSTS: an integer 1..40, else ValueError saying what is allowed."""
    text = str(value)
    if not text.isdigit() or text.startswith("0") or not 1 <= int(text) <= MAX_HOSTS:
        raise ValueError(f"DEMO_HOSTS must be an integer from 1 to {MAX_HOSTS} (got '{value}')")
    return int(text)


def hosts(n: int) -> dict[str, str]:
    """Every host of a demo fleet of n, in inventory order: name -> ansible_host."""
    return {f"demo-{i}": ADDRESS.format(i) for i in range(1, host_count(n) + 1)}


def extra_inventory(n: int, inventory_dir: Path = DEMO_INVENTORY) -> dict:
    """The inventory source of the hosts beyond the static three (empty group for n <= 3)."""
    extra = {name: {"ansible_host": address, "inventory_dir": str(inventory_dir)}
             for name, address in list(hosts(n).items())[STATIC_HOSTS:]}
    return {"sglang_hosts": {"hosts": extra}}


def render(n: int, inventory_dir: Path = DEMO_INVENTORY) -> str:
    return HEADER.format(n=n) + "---\n" + yaml.safe_dump(extra_inventory(n, inventory_dir), sort_keys=False)


def write(n: int, out: Path, inventory_dir: Path = DEMO_INVENTORY) -> Path | None:
    """Write the extra hosts of a fleet of n to out; for n <= 3 remove out (no extra host)."""
    n = host_count(n)
    if n <= STATIC_HOSTS:
        out.unlink(missing_ok=True)
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render(n, inventory_dir), encoding="utf-8")
    tmp.replace(out)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.rsplit("\n\n", 1)[-1], file=sys.stderr)
        return 2
    try:
        written = write(host_count(argv[0]), Path(argv[1]))
    except ValueError as exc:
        print(f"demo_inventory: {exc}", file=sys.stderr)
        return 2
    if written:
        print(written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
