#!/usr/bin/env python3
"""Benchmark (prints figures, asserts nothing about speed): the idempotent re-run of site.yml on
the converged demo fleet against an Ansible floor measured in the same run (a play with fact
gathering and one no-op task on the same hosts), as a ratio; and the wall time for 1 vs 3 hosts.

Needs a converged fleet: the demo fleet (`make demo` first), or any inventory whose first host is named
with --one. Usage: benchmarks/rollout_rerun.py [--runs N] [--inventory DIR --one HOST]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
INVENTORY = ROOT / "inventories" / "demo"
FLOOR = """---
- name: Ansible floor
  hosts: sglang_hosts
  gather_facts: true
  tasks:
    - name: No-op
      ansible.builtin.debug:
        msg: floor
"""


def run(playbook: Path, limit: str | None, inventory: Path = INVENTORY) -> tuple[float, str]:
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook)]
    if limit:
        argv += ["--limit", limit]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FACT_CACHING": "memory"}
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{playbook.name} failed (rc {done.returncode}); is the demo fleet up and converged "
                 f"(make demo)?\n{done.stdout[-2000:]}")
    return elapsed, done.stdout


def changed_total(stdout: str) -> int:
    return sum(int(n) for n in re.findall(r"changed=(\d+)", stdout))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--inventory", type=Path, default=INVENTORY)
    parser.add_argument("--one", default="demo-1", help="the host of the 1-host case")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        floor = Path(tmp) / "floor.yml"
        floor.write_text(FLOOR)
        rows = []
        for limit in (args.one, None):
            site, base, changed = [], [], 0
            for _ in range(args.runs):
                elapsed, out = run(ROOT / "site.yml", limit, args.inventory)
                site.append(elapsed)
                changed += changed_total(out)
                base.append(run(floor, limit, args.inventory)[0])
            rows.append((limit or "all 3 hosts", statistics.median(site), statistics.median(base), changed))
    print(f"{'hosts':<12} {'site.yml re-run':>16} {'Ansible floor':>14} {'ratio':>7} {'changed':>8}")
    for hosts, site_s, floor_s, changed in rows:
        print(f"{hosts:<12} {site_s:>14.1f} s {floor_s:>12.1f} s {site_s / floor_s:>7.1f} {changed:>8}")
    print(f"1 host vs 3 hosts (site.yml re-run): {rows[0][1]:.1f} s vs {rows[1][1]:.1f} s "
          f"(x{rows[1][1] / rows[0][1]:.2f}); medians of {args.runs} runs each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
