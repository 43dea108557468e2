#!/usr/bin/env python3
"""Benchmark (prints figures, asserts nothing about speed): the idempotent re-run of site.yml on
the converged demo fleet against an Ansible floor measured in the same run (a play with fact
gathering and one no-op task on the same hosts), as a ratio; and the wall time for 1 vs 3 hosts.
The same again under Mitogen's mitogen_linear strategy (ANSIBLE_STRATEGY; --no-mitogen leaves it out).
Then two changes that touch one host of the fleet (a host_vars file written into the inventory for
the second host, removed afterwards, and the run that takes it back): one to the service's
environment, one to a unit setting only the service reads. For each: which hosts restarted (their
unit's MainPID), which were probed (the run report's verdicts), which the serial batches visited, and
on the changed host its tasks (PLAY RECAP), those that ran per role, and the install phases left out.

Needs a converged fleet: the demo fleet (`make demo` first), or any inventory whose first host is named
with --one. Usage: benchmarks/rollout_rerun.py [--runs N] [--inventory DIR --one HOST] [--no-mitogen]
(or HICACHE_FLEET_BENCH_INVENTORY / HICACHE_FLEET_BENCH_ONE in the environment, e.g. for `make bench`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

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
# Issue 23's target for the tasks of a one-host change on the changed host.
TARGET_ONE_HOST_TASKS = 150


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


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (every core and process: on the demo
    fleet that is the controller, ssh and the test hosts' Python together)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(n) for n in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal: idle and iowait are not busy.
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def timed(playbook: Path, inventory: Path, strategy_env: dict[str, str]) -> tuple[float, float, str]:
    """run() of a whole-fleet playbook, also giving the machine's busy CPU seconds it took."""
    before = busy_seconds()
    wall, stdout = run(playbook, None, inventory, strategy_env)
    return wall, busy_seconds() - before, stdout


RECAP_LINE = re.compile(
    r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)"
    r"\s+rescued=(\d+)\s+ignored=(\d+)", re.M)
TASK_BANNER = re.compile(r"^TASK \[(.*)\] \*+$")
DONE_LINE = re.compile(r"^(?:ok|changed): \[([^\]]+)\]")


def recap_by_host(stdout: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP's counters per host (ok, changed, unreachable, failed, skipped, rescued, ignored)."""
    recap = stdout.rsplit("PLAY RECAP", 1)
    if len(recap) < 2:
        return {}
    names = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")
    return {m.group(1): dict(zip(names, map(int, m.groups()[1:]), strict=True))
            for m in RECAP_LINE.finditer(recap[1])}


def phases_left_out(stdout: str, host: str) -> list[str]:
    """The install phases the fast path left out on host, as converged.yml says it (one line per host
    in one message: "- 'demo-2: runs every phase but rocm, venv (current): ..."); [] when it runs every
    phase or the line is not there."""
    found = re.search(rf"^\s+- '{re.escape(host)}: runs every phase but ([a-z_, ]+) \(current\)", stdout, re.M)
    return sorted(found.group(1).split(", ")) if found else []


def tasks_by_role(stdout: str, host: str) -> dict[str, int]:
    """The tasks that ran on one host (a result line ok or changed, loop items counted once), per role
    of the TASK banner ("(play)" for a play's own tasks): where a one-host change spends its tasks."""
    counts: dict[str, int] = {}
    role, counted = None, True
    for line in stdout.splitlines():
        banner = TASK_BANNER.match(line)
        if banner:
            name = banner.group(1)
            role, counted = (name.split(" : ", 1)[0] if " : " in name else "(play)"), False
            continue
        result = DONE_LINE.match(line)
        if role and not counted and result and result.group(1).split(" -> ")[0] == host:
            counts[role] = counts.get(role, 0) + 1
            counted = True
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


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


BATCH_PLAY = "Rollout | gated activation of the hosts that change, batch by batch"


def main_pids(inventory: Path, hosts: list[str]) -> dict[str, str]:
    """Each host's sglang-main.service MainPID, read over Ansible's own connection."""
    argv = [str(BIN / "ansible"), "-i", str(inventory), ",".join(hosts), "-o", "-m", "ansible.builtin.command",
            "-a", "systemctl show -p MainPID --value sglang-main.service"]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=True).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r"^(\S+) \| CHANGED \| rc=0 \| \(stdout\) (\d+)", out, re.M)}


def batch_hosts(stdout: str) -> list[str]:
    """The hosts the serial batch play ran tasks on (its task results up to the next play)."""
    play = stdout.split(f"PLAY [{BATCH_PLAY}]", 1)
    if len(play) < 2:
        return []
    body = play[1].split("\nPLAY [", 1)[0]
    found = re.findall(r"^(?:ok|changed|failed|fatal): \[([^\]]+)\]", body, re.M)
    return sorted({name.split(" -> ")[0] for name in found})


def skipped_as_converged(stdout: str) -> list[str]:
    """The hosts site.yml's fast path skipped (roles/rollout tasks/converged.yml says so, a line per host)."""
    return sorted(set(re.findall(r"^\s+- '(\S+): converged: its recorded release", stdout, re.M)))


def report_verdicts(inventory: Path) -> dict[str, str]:
    runs = sorted((inventory / "reports" / "rollout").glob("*/rollout.json"))
    if not runs:
        return {}
    return {h["host"]: h["verdict"] for h in json.loads(runs[-1].read_text())["hosts"]}


def one_host_change(inventory: Path) -> None:
    """Changes touching one host of the fleet, each then its revert; prints what each run touched."""
    hosts_file = inventory / "hosts.yml"
    hosts = list(yaml.safe_load(hosts_file.read_text())["sglang_hosts"]["hosts"])
    target = hosts[1]
    group_vars = yaml.safe_load((inventory / "group_vars" / "sglang_hosts" / "demo.yml").read_text())
    host_vars = inventory / "host_vars" / f"{target}.yml"
    if host_vars.exists():
        print(f"one-host change: {host_vars} exists already; skipped")
        return
    # Two kinds of change: the service's environment (an input of the ROCm phase's GPU check too, so
    # every install phase runs), and a unit setting only the service reads (the install phases are
    # current and left out).
    changes = {
        "environment": {"sglang_service_environment": {**group_vars["sglang_service_environment"],
                                                       "HICACHE_FLEET_BENCH": "one-host change"}},
        "unit only": {"sglang_service_restart_sec": int(group_vars.get("sglang_service_restart_sec", 15)) + 1},
    }
    rows = []
    try:
        host_vars.parent.mkdir(exist_ok=True)
        for kind, overlay in changes.items():
            host_vars.write_text(yaml.safe_dump(overlay))
            for label in (f"{kind}, change on {target}", f"{kind}, revert"):
                before = main_pids(inventory, hosts)
                elapsed, cpu, out = timed(ROOT / "site.yml", inventory, {})
                after = main_pids(inventory, hosts)
                restarted = [h for h in hosts if before.get(h) != after.get(h)]
                verdicts = report_verdicts(inventory)
                probed = [h for h in hosts if verdicts.get(h) == "passed"]
                rows.append((label, elapsed, cpu, recap(out)[0], restarted, probed, batch_hosts(out),
                             skipped_as_converged(out), verdicts, recap_by_host(out).get(target, {}),
                             tasks_by_role(out, target), phases_left_out(out, target)))
                host_vars.unlink(missing_ok=True)
    finally:
        host_vars.unlink(missing_ok=True)
        if host_vars.parent.exists() and not any(host_vars.parent.iterdir()):
            host_vars.parent.rmdir()
    for label, elapsed, cpu, ok, restarted, probed, batched, converged, verdicts, own, roles, left in rows:
        print(f"one-host change, {label}: site.yml {elapsed:.1f} s, {cpu:.1f} CPU s of the machine "
              f"({cpu / elapsed:.2f} cores busy on average), {ok} tasks ok; "
              f"skipped as converged {converged or 'none'}; "
              f"restarted {restarted or 'none'}; probed {probed or 'none'}; visited by the serial batches "
              f"{batched or 'none'}; report {verdicts}")
        print(f"one-host change, {label}, on {target}: {own.get('ok', '?')} tasks ok, {own.get('skipped', '?')} "
              f"skipped (target <= {TARGET_ONE_HOST_TASKS} tasks); install phases left out as current: "
              f"{', '.join(left) or 'none'}; tasks that ran, by role: "
              + (", ".join(f"{role} {n}" for role, n in roles.items()) or "none"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--record", action="store_true",
                        help="write the printed figures into docs/benchmarks.md (benchmarks/record.py)")
    parser.add_argument("--inventory", type=Path,
                        default=Path(os.environ.get("HICACHE_FLEET_BENCH_INVENTORY") or INVENTORY))
    parser.add_argument("--one", default=os.environ.get("HICACHE_FLEET_BENCH_ONE") or "demo-1",
                        help="the host of the 1-host case")
    parser.add_argument("--no-mitogen", action="store_true", help="skip the mitogen_linear rows")
    parser.add_argument("--no-change", action="store_true", help="skip the one-host change and its revert")
    args = parser.parse_args()
    strategies = [("ssh (linear)", {})]
    if not args.no_mitogen:
        # The one setting (README, "Mitogen"): strategy_plugins/mitogen_linear.py, the pinned mitogen.
        strategies.append(("mitogen_linear", {"ANSIBLE_STRATEGY": "mitogen_linear"}))
    # Untimed: a whole run first, so that every host is converged and has its record (a run after a
    # change of the toolkit or the inventory is a whole run, not a re-run).
    try:
        warm_s = run(ROOT / "site.yml", None, args.inventory, {})[0]
    except RuntimeError as exc:
        print(f"the warm-up run failed, no figures: {exc}")
        return 1
    print(f"  warm-up: site.yml on all hosts {warm_s:.1f} s (untimed below)", flush=True)
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
        ratio = ssh_one / mit_one
        than = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
        print(f"mitogen_linear vs ssh, 1 host: {mit_one:.1f} s vs {ssh_one:.1f} s ({than})")
    print(f"medians of {args.runs} runs each; load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"({os.cpu_count()} cores)")
    if not args.no_change:
        one_host_change(args.inventory)
    return 0


if __name__ == "__main__":
    import record  # benchmarks/record.py: --record writes the figures into docs/benchmarks.md

    raise SystemExit(record.run(main, "rollout_rerun"))
