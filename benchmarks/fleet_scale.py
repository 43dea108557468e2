#!/usr/bin/env python3
"""Benchmark (prints figures, asserts nothing about speed): site.yml at fleet scale, on the demo fleet
of 12 (`make demo DEMO_HOSTS=12` first; --hosts N for another size that is up).

(a) The no-change re-run of site.yml on the converged fleet, on 1 host (--limit demo-1) and on all
    N hosts, medians of --runs (default 2), and their ratio (target printed: <= 1.5x).
(b) One fleet-wide change and its revert: sglang_service_environment with one variable more, given
    as an extra var file (-e @file outranks the demo's group_vars on every host, as an edit of
    inventories/demo/group_vars would), so every host's environment file changes and every host
    restarts through the gate, batch by batch (benchmarks/rollout_rerun.py makes the same change on
    one host by a host_vars file). The revert is the same run without it: every host restarts
    again, back on the demo config. For each: the total wall time, the serial batches (the batch
    play's banner opens each one; the lines of ansible-playbook's output are stamped as they are
    read) and each batch's time and hosts, the hosts restarted (their unit's MainPID), the machine's
    busy CPU seconds per changed host (/proc/stat: the controller, ssh and the test hosts' Python
    share these cores) and the tasks ok per changed host (PLAY RECAP). The fleet is left converged
    on the demo config: a failed change or revert is followed by a run that takes it back.

It first runs site.yml once untimed on all N hosts, so that every host is converged and recorded.
The N hosts are demo-1..N, read off `molecule/resources/hosts.sh list`; the hosts beyond the
inventory's three get an inventory of their own from scripts/demo_inventory.py, in a temp dir,
passed after -i inventories/demo (as scripts/demo.sh does). Fewer than N up: skipped, exit 0,
nothing recorded. Usage: benchmarks/fleet_scale.py [--hosts N] [--runs N] [--no-change] [--record]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import record  # benchmarks/record.py: --record, and Skipped when the fleet is not up
import rollout_rerun  # the same bench's helpers: busy_seconds, recap, batch play, fast path, reports
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "scripts"))
import demo_inventory  # noqa: E402 (scripts/demo_inventory.py: the extra hosts' inventory)

INVENTORY = ROOT / "inventories" / "demo"
HOSTS_SH = ROOT / "molecule" / "resources" / "hosts.sh"
DEFAULT_HOSTS = 12
# Printed next to the figure (not asserted: this is a benchmark).
TARGET_FLEET_RATIO = 1.5
CHANGE_VARIABLE = "HICACHE_FLEET_BENCH"
RESULT_LINE = re.compile(r"^(?:ok|changed|failed|fatal): \[([^\]]+)\]")


# --- parsing (plain functions over captured output: tests/test_fleet_scale.py) ------------------------

def hosts_up(listing: str, wanted: int) -> list[str]:
    """demo-1..demo-K out of `hosts.sh list` (NAME, ADDRESS, running|stopped; tab-separated): the
    running demo hosts from demo-1 on without a gap, at most `wanted`."""
    running = {cols[0] for cols in (line.split("\t") for line in listing.splitlines())
               if len(cols) >= 3 and cols[2].strip() == "running"}
    up = []
    for i in range(1, wanted + 1):
        if f"demo-{i}" not in running:
            break
        up.append(f"demo-{i}")
    return up


@dataclass
class Batch:
    start: float
    end: float
    hosts: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.end - self.start


def batches(lines: list[tuple[float, str]], play: str = rollout_rerun.BATCH_PLAY) -> list[Batch]:
    """The serial batches of the play named `play` in stamped output lines (seconds, text): each
    batch from its play banner to the next banner (of any play, or PLAY RECAP), with the hosts
    its task results name (a delegated result `host -> localhost` counts for host)."""
    found: list[Batch] = []
    current: Batch | None = None
    for stamp, text in lines:
        if text.startswith(("PLAY [", "PLAY RECAP")):
            if current is not None:
                current.end = stamp
                found.append(current)
                current = None
            if text.startswith(f"PLAY [{play}]"):
                current = Batch(stamp, stamp)
            continue
        match = RESULT_LINE.match(text)
        if current is not None and match:
            host = match.group(1).split(" -> ")[0]
            if host not in current.hosts:
                current.hosts.append(host)
    if current is not None:  # the output ended inside a batch (a run that was cut)
        current.end = lines[-1][0] if lines else current.start
        found.append(current)
    return found


def change_overlay(group_vars: dict, value: str = "fleet-wide change") -> dict:
    """The extra vars of the fleet-wide change: the demo's sglang_service_environment plus one variable."""
    return {"sglang_service_environment": {**group_vars["sglang_service_environment"], CHANGE_VARIABLE: value}}


# --- running ---------------------------------------------------------------------------------------

@dataclass
class Run:
    rc: int
    wall: float
    cpu: float
    lines: list[tuple[float, str]]

    @property
    def stdout(self) -> str:
        return "\n".join(text for _, text in self.lines) + "\n"


def stamped(argv: list[str], timeout: float = 3600) -> Run:
    """Run argv, reading its output line by line and stamping each line (seconds since the start)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FACT_CACHING": "memory",
           "PYTHONUNBUFFERED": "1", "ANSIBLE_NOCOLOR": "1"}
    for name in ("ANSIBLE_STRATEGY", "ANSIBLE_FORCE_COLOR"):
        env.pop(name, None)
    before = rollout_rerun.busy_seconds()
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=env, bufsize=1)
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append((time.perf_counter() - start, line.rstrip("\n")))
        rc = proc.wait()
    finally:
        watchdog.cancel()
    return Run(rc, time.perf_counter() - start, rollout_rerun.busy_seconds() - before, lines)


class Fleet:
    """The demo fleet of the first n demo hosts: its inventory sources and how to run on it."""

    def __init__(self, hosts: list[str], tmp: Path) -> None:
        self.hosts = hosts
        self.sources = [INVENTORY]
        extra = demo_inventory.write(len(hosts), tmp / "hosts-extra.yml")
        if extra:
            self.sources.append(extra)
        # A fleet smaller than inventories/demo's three: the others are not up.
        self.limit = ",".join(hosts) if len(hosts) < demo_inventory.STATIC_HOSTS else None

    def inventory_args(self) -> list[str]:
        return [arg for source in self.sources for arg in ("-i", str(source))]

    def site(self, limit: str | None = None, extra_vars: Path | None = None) -> Run:
        argv = [str(BIN / "ansible-playbook"), *self.inventory_args(), str(ROOT / "site.yml")]
        if limit or self.limit:
            argv += ["--limit", limit or self.limit]
        if extra_vars:
            argv += ["-e", f"@{extra_vars}"]
        return stamped(argv)

    def checked_site(self, what: str, **kwargs) -> Run:
        done = self.site(**kwargs)
        if done.rc != 0:
            raise RuntimeError(f"{what}: site.yml failed (rc {done.rc}); the last lines:\n"
                               + "\n".join(text for _, text in done.lines[-40:]))
        return done

    def main_pids(self) -> dict[str, str]:
        """Each host's sglang-main.service MainPID, over Ansible's own connection."""
        argv = [str(BIN / "ansible"), *self.inventory_args(), ",".join(self.hosts), "-o", "-m",
                "ansible.builtin.command", "-a", "systemctl show -p MainPID --value sglang-main.service"]
        out = stamped(argv, timeout=600).stdout
        return {m.group(1): m.group(2)
                for m in re.finditer(r"^(\S+) \| CHANGED \| rc=0 \| \(stdout\) (\d+)", out, re.M)}


def no_change(fleet: Fleet, runs: int) -> list[str]:
    """(a): the no-change re-run on one host and on the fleet, medians of runs; the printed lines."""
    rows = {}
    for label, limit in (("1 host (--limit demo-1)", fleet.hosts[0]), (f"{len(fleet.hosts)} hosts", None)):
        walls, last = [], None
        for _ in range(runs):
            last = fleet.checked_site(f"no-change re-run, {label}", limit=limit)
            walls.append(last.wall)
        converged = rollout_rerun.skipped_as_converged(last.stdout)
        wanted = 1 if limit else len(fleet.hosts)
        rows[label] = (statistics.median(walls), walls, len(converged), wanted, rollout_rerun.recap(last.stdout)[0])
        print(f"  measured: no-change re-run, {label}: {', '.join(f'{w:.1f} s' for w in walls)}", flush=True)
    lines = [f"no-change re-run of site.yml on the converged fleet (medians of {runs}):"]
    for label, (median, walls, converged, wanted, ok) in rows.items():
        lines.append(f"  {label:<24} {median:6.1f} s (runs: {', '.join(f'{w:.1f}' for w in walls)} s); "
                     f"skipped as converged {converged}/{wanted}; {ok} tasks ok")
    (one, *_), (fleet_s, *_) = rows.values()
    lines.append(f"  {len(fleet.hosts)} hosts / 1 host: {fleet_s / one:.2f}x (target <= {TARGET_FLEET_RATIO:g}x)")
    return lines


def fleet_run(fleet: Fleet, label: str, extra_vars: Path | None) -> None:
    """One fleet-wide run of site.yml that changes every host; prints its figures."""
    before = fleet.main_pids()
    done = fleet.checked_site(label, extra_vars=extra_vars)
    after = fleet.main_pids()
    restarted = [h for h in fleet.hosts if before.get(h) != after.get(h)]
    verdicts = rollout_rerun.report_verdicts(INVENTORY)
    passed = [h for h in fleet.hosts if verdicts.get(h) == "passed"]
    found = batches(done.lines)
    changed = [h for batch in found for h in batch.hosts]
    recap = rollout_rerun.recap_by_host(done.stdout)
    oks = [recap[h]["ok"] for h in changed if h in recap]
    per_batch = "; ".join(f"#{i} {len(b.hosts)} host{'s' if len(b.hosts) != 1 else ''} {b.seconds:.1f} s"
                          for i, b in enumerate(found, 1))
    lines = [f"  {label}: site.yml {done.wall:.1f} s wall; {len(found)} serial batches: {per_batch or 'none'}"]
    if found:
        lines.append(f"    before the first batch {found[0].start:.1f} s (converged check, preflight, phases, "
                     f"staging), after the last {done.wall - found[-1].end:.1f} s")
    lines.append(f"    changed (visited by the batches) {len(changed)}/{len(fleet.hosts)}, restarted (MainPID) "
                 f"{len(restarted)}/{len(fleet.hosts)}, probed and passed {len(passed)}/{len(fleet.hosts)}")
    cpu = f"    {done.cpu:.1f} CPU s of the machine ({done.cpu / done.wall:.2f} cores busy on average)"
    if changed:
        cpu += f" = {done.cpu / len(changed):.1f} CPU s per changed host"
    if oks:
        cpu += f"; tasks ok per changed host {statistics.mean(oks):.0f} (min {min(oks)}, max {max(oks)})"
    lines.append(cpu)
    for line in lines:
        print(line, flush=True)


def fleet_change(fleet: Fleet, tmp: Path) -> None:
    """(b): the fleet-wide change and its revert; a failed one is followed by a run back to the demo config."""
    group_vars = yaml.safe_load((INVENTORY / "group_vars" / "sglang_hosts" / "demo.yml").read_text())
    overlay = tmp / "fleet-change.yml"
    overlay.write_text(yaml.safe_dump(change_overlay(group_vars)))
    print(f"fleet-wide change on {len(fleet.hosts)} hosts (sglang_service_environment plus {CHANGE_VARIABLE}, "
          "-e @file), then its revert (site.yml without it):", flush=True)
    back = False
    try:
        fleet_run(fleet, "change", overlay)
        fleet_run(fleet, "revert", None)
        back = True
    finally:
        if not back:
            print("fleet_scale: the change or its revert failed; site.yml once more on the demo config", flush=True)
            done = fleet.site()
            print(f"fleet_scale: that run {'converged the fleet' if done.rc == 0 else f'FAILED too (rc {done.rc})'} "
                  f"in {done.wall:.1f} s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=DEFAULT_HOSTS,
                        help=f"the fleet: demo-1..N, all up (default {DEFAULT_HOSTS}: make demo DEMO_HOSTS=12)")
    parser.add_argument("--runs", type=int, default=2, help="runs per no-change figure (the median is printed)")
    parser.add_argument("--record", action="store_true",
                        help="write the printed figures into docs/benchmarks.md (benchmarks/record.py)")
    parser.add_argument("--no-change", action="store_true", help="skip the fleet-wide change and its revert")
    args = parser.parse_args()
    try:
        demo_inventory.host_count(args.hosts)
    except ValueError as exc:
        parser.error(f"--hosts: {exc}")
    listing = subprocess.run([str(HOSTS_SH), "list"], capture_output=True, text=True, check=False).stdout
    hosts = hosts_up(listing, args.hosts)
    if len(hosts) < args.hosts:
        raise record.Skipped(
            f"a demo fleet of {args.hosts} is not up (running without a gap from demo-1: {len(hosts)}); "
            f"make demo DEMO_HOSTS={args.hosts} first, or --hosts {len(hosts) or 1} to measure what is up")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
        fleet = Fleet(hosts, Path(tmp))
        print(f"demo fleet of {len(hosts)} ({hosts[0]}..{hosts[-1]}), ssh (linear), {os.cpu_count()} cores", flush=True)
        try:
            warm = fleet.checked_site("warm-up")
            print(f"  warm-up: site.yml on all {len(hosts)} hosts {warm.wall:.1f} s (untimed below)", flush=True)
            lines = no_change(fleet, args.runs)
            for line in lines:
                print(line, flush=True)
            if not args.no_change:
                fleet_change(fleet, Path(tmp))
        except RuntimeError as exc:
            print(f"fleet_scale: FAILED, no figures recorded: {exc}")
            return 1
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(record.run(main, "fleet_scale"))
