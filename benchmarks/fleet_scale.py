#!/usr/bin/env python3
"""Benchmark (prints figures, asserts nothing about speed): site.yml at fleet scale, on the demo fleet
of 12 (`make demo DEMO_HOSTS=12` first; --hosts N for another size that is up).

(a) The no-change re-run of site.yml on the converged fleet, on 1 host (--limit demo-1) and on all
    N hosts, medians of --runs (default 2), and their ratio (target printed: <= 1.5x). Beside them,
    Ansible's own floor on the same hosts, measured in the same run: a play of one
    ansible.builtin.ping per host with gather_facts: false (written to a temp file, run as site.yml
    is, then removed), on 1 host and on N, its N/1 ratio, and how much of the re-run's growth from
    1 to N hosts is the floor's.
(b) One fleet-wide change and its revert: sglang_service_environment with one variable more, given
    as an extra var file (-e @file outranks the demo's group_vars on every host, as an edit of
    inventories/demo/group_vars would), so every host's environment file changes and every host
    restarts through the gate, batch by batch (benchmarks/rollout_rerun.py makes the same change on
    one host by a host_vars file). The revert is the same run without it: every host restarts
    again, back on the demo config. For each: the total wall time, the serial batches (the batch
    play's banner opens each one; the lines of ansible-playbook's output are stamped as they are
    read) and each batch's time and hosts, the hosts restarted (their unit's MainPID), the machine's
    busy CPU seconds per changed host (/proc/stat: the controller, ssh and the test hosts' Python
    share these cores) and the tasks ok per changed host (PLAY RECAP), and that CPU per changed
    host split into the test hosts' (every process in another PID namespace than the controller's:
    the systemd-nspawn hosts; read off /proc/PID/stat, a lower bound) and the controller's (the
    rest). The fleet is left converged on the demo config: a failed change or revert is followed
    by a run that takes it back.

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
# Ansible's own floor: one Python module call per host and nothing else (no facts), on the hosts
# site.yml runs on, under the same inventory, limit and environment as the no-change re-runs.
FLOOR_PLAY = """---
- name: Ansible floor (one ping per host)
  hosts: sglang_hosts
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""


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


def floor_lines(hosts: int, runs: int, floor_one: list[float], floor_fleet: list[float],
                site_one: float, site_fleet: float) -> list[str]:
    """The printed lines of Ansible's floor (the ping play's wall times on 1 host and on `hosts`) next
    to the no-change re-run's medians on the same hosts: each against the re-run, the floor's own
    N/1 ratio, and the share of the re-run's growth from 1 to N hosts that the floor's growth is."""
    one, fleet = statistics.median(floor_one), statistics.median(floor_fleet)
    lines = [f"Ansible's floor on the same hosts (one ansible.builtin.ping per host, gather_facts: false; "
             f"medians of {runs}):"]
    for label, walls, floor, site in (("1 host (--limit demo-1)", floor_one, one, site_one),
                                      (f"{hosts} hosts", floor_fleet, fleet, site_fleet)):
        lines.append(f"  {label:<24} {floor:6.2f} s (runs: {', '.join(f'{w:.2f}' for w in walls)} s); "
                     f"the re-run {site:.1f} s = {site / floor:.1f}x the floor")
    growth, floor_growth = site_fleet - site_one, fleet - one
    ratio = f"  floor {hosts} hosts / 1 host: {fleet / one:.2f}x (the re-run's {site_fleet / site_one:.2f}x)"
    if growth > 0:
        ratio += (f"; from 1 to {hosts} hosts the re-run grows {growth:.1f} s, the floor {floor_growth:.2f} s "
                  f"({100 * floor_growth / growth:.0f}% of the re-run's growth)")
    else:
        ratio += f"; the re-run does not grow from 1 to {hosts} hosts (the floor {floor_growth:+.2f} s)"
    lines.append(ratio)
    return lines


def guest_seconds(proc_root: str | Path = "/proc") -> float:
    """CPU seconds of the test hosts so far: over every process in proc_root whose PID namespace
    (its ns/pid link) is not the controller's own (self/ns/pid), utime + stime + cutime + cstime
    (fields 14-17 of PID/stat, counted after the last ')': the comm field may hold spaces and
    parentheses), in clock ticks over SC_CLK_TCK. The test hosts are systemd-nspawn containers, each
    its own PID namespace; every other process in another PID namespace counts too (containers that
    are not the demo's, e.g. test hosts of other runs on the machine). A process that vanishes or
    cannot be read (another user's, when not root) is skipped.

    The difference of two readings is a lower bound of the test hosts' CPU between them: a process
    that exited and was reaped inside a container is still counted, through the cutime/cstime of its
    parent; one that exited between the two readings and whose parent exited too is missed."""
    root = Path(proc_root)
    own = os.readlink(root / "self" / "ns" / "pid")
    ticks = 0
    with os.scandir(root) as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(os.path.join(entry.path, "ns", "pid")) == own:
                    continue
                with open(os.path.join(entry.path, "stat"), "rb") as stat:
                    text = stat.read()
                # After "pid (comm) ": field 3 (state) is the first, so fields 14-17 are [11:15].
                fields = text[text.rindex(b")") + 1:].split()
                if len(fields) < 15:  # cut short while it exited
                    continue
                ticks += sum(int(n) for n in fields[11:15])
            except (OSError, ValueError):  # gone (or a zombie: no ns link), unreadable, or cut short
                continue
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_split_line(total_cpu_s: float, guest_cpu_s: float, hosts: int) -> str:
    """The printed line of a run's CPU per changed host: the machine's busy CPU seconds (total) =
    the test hosts' (guest_seconds' difference, a lower bound) + the controller's (the rest)."""
    if hosts < 1:
        raise ValueError(f"cpu_split_line: hosts must be at least 1 (got {hosts})")
    total, guest = total_cpu_s / hosts, guest_cpu_s / hosts
    share = f"{100 * guest_cpu_s / total_cpu_s:.0f}%" if total_cpu_s > 0 else "n/a"
    return (f"    per changed host: {total:.1f} CPU s = {guest:.1f} test-host CPU s + {total - guest:.1f} controller "
            f"CPU s (test hosts {share}: processes in other PID namespaces than the controller's, a lower bound)")


# --- running ---------------------------------------------------------------------------------------

@dataclass
class Run:
    rc: int
    wall: float
    cpu: float
    lines: list[tuple[float, str]]
    # guest_seconds' difference over the run: the part of cpu that the test hosts spent (a lower bound).
    guest: float = 0.0

    @property
    def stdout(self) -> str:
        return "\n".join(text for _, text in self.lines) + "\n"


def stamped(argv: list[str], timeout: float = 3600) -> Run:
    """Run argv, reading its output line by line and stamping each line (seconds since the start)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FACT_CACHING": "memory",
           "PYTHONUNBUFFERED": "1", "ANSIBLE_NOCOLOR": "1"}
    for name in ("ANSIBLE_STRATEGY", "ANSIBLE_FORCE_COLOR"):
        env.pop(name, None)
    # The test hosts' share of the run's CPU, read around the busy window (so that the scan of /proc,
    # the benchmark's own CPU, is not the run's). A lower bound: a process that exited and was reaped
    # inside a container is counted through its parent's cutime/cstime, but one that exited between
    # the two readings together with its parent (a whole ssh session's tree, say) is missed.
    guest_before = guest_seconds()
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
    wall, cpu = time.perf_counter() - start, rollout_rerun.busy_seconds() - before
    return Run(rc, wall, cpu, lines, guest_seconds() - guest_before)


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

    def site(self, limit: str | None = None, extra_vars: Path | None = None, playbook: Path = ROOT / "site.yml") -> Run:
        argv = [str(BIN / "ansible-playbook"), *self.inventory_args(), str(playbook)]
        if limit or self.limit:
            argv += ["--limit", limit or self.limit]
        if extra_vars:
            argv += ["-e", f"@{extra_vars}"]
        return stamped(argv)

    def checked_site(self, what: str, **kwargs) -> Run:
        done = self.site(**kwargs)
        if done.rc != 0:
            name = kwargs["playbook"].name if "playbook" in kwargs else "site.yml"
            raise RuntimeError(f"{what}: {name} failed (rc {done.rc}); the last lines:\n"
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
    """(a): the no-change re-run on one host and on the fleet, medians of runs, and Ansible's floor on
    the same hosts (the ping play, run after each re-run); the printed lines."""
    rows, floors = {}, {}
    # The floor's play in a temp file of its own, removed when the measurements are done.
    with tempfile.NamedTemporaryFile("w", prefix="fleet-scale-floor-", suffix=".yml", encoding="utf-8") as play:
        play.write(FLOOR_PLAY)
        play.flush()
        floor_play = Path(play.name)
        for label, limit in (("1 host (--limit demo-1)", fleet.hosts[0]), (f"{len(fleet.hosts)} hosts", None)):
            walls, floor_walls, last = [], [], None
            for _ in range(runs):
                last = fleet.checked_site(f"no-change re-run, {label}", limit=limit)
                walls.append(last.wall)
                floor_walls.append(fleet.checked_site(f"Ansible floor, {label}", limit=limit, playbook=floor_play).wall)
            converged = rollout_rerun.skipped_as_converged(last.stdout)
            wanted = 1 if limit else len(fleet.hosts)
            rows[label] = (statistics.median(walls), walls, len(converged), wanted,
                           rollout_rerun.recap(last.stdout)[0])
            floors[label] = floor_walls
            print(f"  measured: no-change re-run, {label}: {', '.join(f'{w:.1f} s' for w in walls)}", flush=True)
            print(f"  measured: Ansible floor (ping), {label}: {', '.join(f'{w:.2f} s' for w in floor_walls)}",
                  flush=True)
    lines = [f"no-change re-run of site.yml on the converged fleet (medians of {runs}):"]
    for label, (median, walls, converged, wanted, ok) in rows.items():
        lines.append(f"  {label:<24} {median:6.1f} s (runs: {', '.join(f'{w:.1f}' for w in walls)} s); "
                     f"skipped as converged {converged}/{wanted}; {ok} tasks ok")
    (one, *_), (fleet_s, *_) = rows.values()
    lines.append(f"  {len(fleet.hosts)} hosts / 1 host: {fleet_s / one:.2f}x (target <= {TARGET_FLEET_RATIO:g}x)")
    floor_one, floor_fleet = floors.values()
    lines += floor_lines(len(fleet.hosts), runs, floor_one, floor_fleet, one, fleet_s)
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
    if changed:
        lines.append(cpu_split_line(done.cpu, done.guest, len(changed)))
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
