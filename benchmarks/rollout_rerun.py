#!/usr/bin/env python3
"""Benchmark (prints figures, asserts nothing about speed): the idempotent re-run of site.yml on
the converged demo fleet against an Ansible floor measured in the same run (a play with fact
gathering and one no-op task on the same hosts), as a ratio; and the wall time for 1 vs 3 hosts.
With Mitogen installed (requirements/mitogen.txt), the same again under its mitogen_linear strategy.

Needs a converged fleet: the demo fleet (`make demo` first), or any inventory whose first host is named
with --one. Usage: benchmarks/rollout_rerun.py [--runs N] [--inventory DIR --one HOST] [--no-mitogen]
(or HICACHE_FLEET_BENCH_INVENTORY / HICACHE_FLEET_BENCH_ONE in the environment, e.g. for `make bench`).
"""

from __future__ import annotations

import argparse
import importlib.util
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
# Issue 14's targets, printed next to the figures (not asserted: this is a benchmark).
TARGET_FLOOR_RATIO = 15.0
TARGET_FLEET_RATIO = 1.3


def mitogen_strategy_dir() -> Path | None:
    """The directory of Mitogen's strategy plugins: ANSIBLE_STRATEGY_PLUGINS when it holds them (Mitogen
    in a venv of its own), else where ansible_mitogen is importable here; None without Mitogen."""
    for given in filter(None, os.environ.get("ANSIBLE_STRATEGY_PLUGINS", "").split(os.pathsep)):
        if (Path(given) / "mitogen_linear.py").is_file():
            return Path(given)
    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "plugins" / "strategy"
    return path if (path / "mitogen_linear.py").is_file() else None


def run(playbook: Path, limit: str | None, inventory: Path, strategy_env: dict[str, str]) -> tuple[float, str]:
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook)]
    if limit:
        argv += ["--limit", limit]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FACT_CACHING": "memory"}
    env.pop("ANSIBLE_STRATEGY", None)
    env.update(strategy_env)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{playbook.name} failed (rc {done.returncode}); is the demo fleet up and converged "
                           f"(make demo)?\n{done.stdout[-2000:]}")
    return elapsed, done.stdout


def recap(stdout: str) -> tuple[int, int]:
    """Tasks ok and changed, summed over the hosts of the PLAY RECAP."""
    ok = sum(int(n) for n in re.findall(r"\bok=(\d+)", stdout))
    changed = sum(int(n) for n in re.findall(r"changed=(\d+)", stdout))
    return ok, changed


def measure(label: str, strategy_env: dict[str, str], args: argparse.Namespace, floor: Path) -> list[tuple]:
    rows = []
    for limit in (args.one, None):
        site, base, changed, ok = [], [], 0, 0
        for _ in range(args.runs):
            elapsed, out = run(ROOT / "site.yml", limit, args.inventory, strategy_env)
            site.append(elapsed)
            run_ok, run_changed = recap(out)
            ok, changed = run_ok, changed + run_changed
            base.append(run(floor, limit, args.inventory, strategy_env)[0])
        rows.append((label, limit or "all hosts", statistics.median(site), statistics.median(base), ok, changed))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--inventory", type=Path,
                        default=Path(os.environ.get("HICACHE_FLEET_BENCH_INVENTORY") or INVENTORY))
    parser.add_argument("--one", default=os.environ.get("HICACHE_FLEET_BENCH_ONE") or "demo-1",
                        help="the host of the 1-host case")
    parser.add_argument("--no-mitogen", action="store_true", help="skip the Mitogen rows even when it is installed")
    args = parser.parse_args()
    strategies = [("ssh (linear)", {})]
    mitogen = None if args.no_mitogen else mitogen_strategy_dir()
    if mitogen:
        # Mitogen checks host keys itself from host_key_checking (ansible.cfg: true) and ignores the
        # inventory's -o StrictHostKeyChecking=no, which the demo's throwaway guests rely on.
        strategies.append(("mitogen_linear", {"ANSIBLE_STRATEGY_PLUGINS": str(mitogen),
                                              "ANSIBLE_STRATEGY": "mitogen_linear",
                                              "ANSIBLE_HOST_KEY_CHECKING": "False"}))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        floor = Path(tmp) / "floor.yml"
        floor.write_text(FLOOR)
        rows = []
        for label, env in strategies:
            try:
                rows += measure(label, env, args, floor)
            except RuntimeError as exc:
                print(f"{label}: FAILED, no figures: {exc}")
                if not rows:
                    return 1
            for row in rows[-2:]:
                print(f"  measured: {row[0]} {row[1]}: site.yml {row[2]:.1f} s, floor {row[3]:.2f} s", flush=True)
    load_after = os.getloadavg()
    print(f"{'strategy':<15} {'hosts':<10} {'site.yml re-run':>16} {'Ansible floor':>14} {'ratio':>6} "
          f"{'tasks ok':>9} {'changed':>8}")
    for label, hosts, site_s, floor_s, ok, changed in rows:
        print(f"{label:<15} {hosts:<10} {site_s:>14.1f} s {floor_s:>12.2f} s {site_s / floor_s:>5.1f}x "
              f"{ok:>9} {changed:>8}")
    for label in dict.fromkeys(r[0] for r in rows):
        one, fleet = [r for r in rows if r[0] == label]
        print(f"{label}: 1 host no-change {one[2]:.1f} s = {one[2] / one[3]:.1f}x the floor "
              f"(target <= {TARGET_FLOOR_RATIO:g}x); all hosts {fleet[2]:.1f} s = {fleet[2] / one[2]:.2f}x one host "
              f"(target <= {TARGET_FLEET_RATIO:g}x)")
    if len(rows) == 4:
        ssh_one, mit_one = rows[0][2], rows[2][2]
        print(f"mitogen_linear vs ssh, 1 host: {mit_one:.1f} s vs {ssh_one:.1f} s ({ssh_one / mit_one:.2f}x faster)")
    elif not args.no_mitogen:
        print("Mitogen not installed (pip install -r requirements/mitogen.txt): no mitogen_linear rows")
    print(f"medians of {args.runs} runs each; load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
