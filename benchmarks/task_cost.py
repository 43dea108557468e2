#!/usr/bin/env python3
"""Benchmark (prints figures, asserts nothing about speed): what one Ansible task costs on one host of
the converged demo fleet, in wall time and in CPU, by kind of task, under the plain SSH strategy and
under Mitogen's mitogen_linear. The test hosts share the controller's cores, so the machine's busy
CPU time (/proc/stat, every process: the controller, ssh, the hosts' Python) is what a task costs the
whole machine, and what bounds `make test` on a machine with few cores.

Each kind is a play of N identical tasks; its cost per task is (run - empty run) / N, both measured
in this run:
  local   ansible.builtin.debug: runs on the controller only
  raw     ansible.builtin.raw true: the SSH round trip, no Python on the host
  module  ansible.builtin.ping: a Python module on the host (AnsiballZ: the host's Python unpacks
          and imports ansible.module_utils.basic for every task)
rollout_rerun.py's one-host change prints the CPU time and task count of a whole run that changes a
host, to read against these figures.

Needs the demo fleet (`make demo`). Usage: benchmarks/task_cost.py [--tasks N] [--no-mitogen]
(HICACHE_FLEET_BENCH_INVENTORY / HICACHE_FLEET_BENCH_ONE as for rollout_rerun.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_rerun import INVENTORY, timed  # a sibling benchmark's runner

KINDS = {
    "local": {"ansible.builtin.debug": {"msg": "x"}},
    "raw": {"ansible.builtin.raw": "true", "changed_when": False},
    "module": {"ansible.builtin.ping": {}},
}


def play(host: str, tasks: list[dict]) -> str:
    return yaml.safe_dump([{"name": "task cost", "hosts": host, "gather_facts": False, "tasks": tasks}],
                          sort_keys=False)


def per_task(label: str, env: dict[str, str], args: argparse.Namespace, tmp: Path) -> list[tuple]:
    # The run every kind is measured against: the same play with only its first task.
    empty = tmp / "empty.yml"
    empty.write_text(play(args.one, [{"name": "one", **KINDS["local"]}]))
    base_wall, base_cpu, _ = timed(empty, args.inventory, env)
    rows = []
    for kind, task in KINDS.items():
        path = tmp / f"{kind}.yml"
        path.write_text(play(args.one, [{"name": "one", **KINDS["local"]}]
                             + [{"name": f"{kind} {i}", **task} for i in range(args.tasks)]))
        wall, cpu, _ = timed(path, args.inventory, env)
        rows.append((label, kind, (wall - base_wall) / args.tasks, (cpu - base_cpu) / args.tasks))
        print(f"  measured: {label} {kind}: {args.tasks} tasks {wall:.1f} s wall, {cpu:.1f} CPU s "
              f"(empty run {base_wall:.1f} s, {base_cpu:.1f} CPU s)", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--record", action="store_true",
                        help="write the printed figures into docs/benchmarks.md (benchmarks/record.py)")
    parser.add_argument("--inventory", type=Path,
                        default=Path(os.environ.get("HICACHE_FLEET_BENCH_INVENTORY") or INVENTORY))
    parser.add_argument("--one", default=os.environ.get("HICACHE_FLEET_BENCH_ONE") or "demo-1")
    parser.add_argument("--no-mitogen", action="store_true", help="skip the mitogen_linear rows")
    args = parser.parse_args()
    if args.tasks < 1:
        parser.error("--tasks must be 1 or more")
    strategies = [("ssh (linear)", {})]
    if not args.no_mitogen:
        strategies.append(("mitogen_linear", {"ANSIBLE_STRATEGY": "mitogen_linear"}))
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, env in strategies:
            try:
                rows += per_task(label, env, args, Path(tmp))
            except RuntimeError as exc:
                print(f"{label}: FAILED, no figures: {exc}")
                return 1
    print(f"{'strategy':<15} {'task':<7} {'wall per task':>14} {'CPU per task':>13}")
    for label, kind, wall, cpu in rows:
        print(f"{label:<15} {kind:<7} {wall * 1000:>11.0f} ms {cpu * 1000:>10.0f} ms")
    print(f"{args.tasks} tasks of each kind on {args.one}; load average before {load_before[0]:.2f}, "
          f"after {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    import record  # benchmarks/record.py: --record writes the figures into docs/benchmarks.md

    raise SystemExit(record.run(main, "task_cost"))
