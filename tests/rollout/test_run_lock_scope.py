"""One run lock for the whole run (issue 24, item 3), run by the real playbooks on localhost
(connection local, the hosts' state directory in tmp_path; no test host):

- a second run started while another live run on this controller holds the lock (a sleeping
  process this test starts and stops by PID) is refused by site.yml's lock play, by a phase
  playbook run alone and by ab_benchmark.yml's lock play, naming the holder, before any later play
  starts and without writing a file;
- a phase playbook run alone takes the lock at its start and releases it at its end; under
  site.yml the lock taken after preflight is the same record at the start of every later play
  (the phases' own lock and release plays included) and only site.yml's last play releases it;
- the rollout phase (roles/rollout `open`, as playbooks/rollout.yml runs it) reuses that lock: the
  run directory and run.json carry its run id, its takeover warnings reach run.json and the report,
  and rollout.yml's own release (scope rollout.yml) leaves site.yml's lock held;
- a refused input (preflight) under site.yml leaves no lock anywhere; a run that died holding the
  lock (a failed phase, a kill) leaves it, and the next run takes it over with a warning;
- an A/B that fails releases the lock (block/always).

The plays run with `--tags lock` where the phases would otherwise work on this machine: the lock
plays are tagged `always`, and the inventory puts the host into _current_rocm, _current_venv and
_current_models, so the phases' own plays target no host (nothing is installed here even if a lock
check were broken). A small callback (written into tmp_path) records, at the start of every play and
at the end of the run, which lock files exist and what they hold: the state a user would look at.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
lock = load("roles/rollout/filter_plugins/rollout_lock.py")

HOLDER_RUN = "20270101T000000Z"
RELEASE_PLAY = "Run lock | release it at the end of the playbook that took it"
TAKE_PLAY = "Run lock | take it before any host is changed (refused while another run holds it)"

PROBE = '''
import json, os
from pathlib import Path
from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "lock_probe"
    CALLBACK_NEEDS_ENABLED = True

    def _note(self, what):
        locks = {}
        for kind in ("controller", "host"):
            path = os.environ["PROBE_" + kind.upper() + "_LOCK"]
            p = Path(path)
            locks[kind] = json.loads(p.read_text()) if p.exists() else None
        with open(os.environ["PROBE_LOG"], "a") as handle:
            handle.write(json.dumps({"play": what, "locks": locks}) + "\\n")

    def v2_playbook_on_play_start(self, play):
        self._note(play.get_name())

    def v2_playbook_on_stats(self, stats):
        self._note("END")
'''


class Fleet:
    """A one-host fleet on localhost in tmp_path, and ansible-playbook runs against it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.state, self.reports = tmp_path / "state", tmp_path / "reports"
        self.host_lock, self.controller_lock = self.state / "rollout.lock", self.reports / "rollout.lock"
        self.log = tmp_path / "probe" / "log.jsonl"
        (tmp_path / "probe").mkdir()
        (tmp_path / "probe" / "lock_probe.py").write_text(PROBE, encoding="utf-8")
        host = {"ansible_connection": "local", "ansible_host": "127.0.0.1",
                "ansible_python_interpreter": sys.executable}
        inventory = {"sglang_hosts": {"hosts": {"node-1": host}},
                     # The phases' own plays target no host here (see the module docstring).
                     **{f"_current_{phase}": {"hosts": {"node-1": {}}} for phase in ("rocm", "venv", "models")}}
        (tmp_path / "inventory").mkdir()
        (tmp_path / "inventory" / "hosts.yml").write_text(json.dumps(inventory), encoding="utf-8")
        self.variables = {
            "_rollout_host_state_dir": str(self.state),
            "rollout_lock_path": str(self.host_lock),
            "rollout_record_path": f"{self.state}/validated.json",
            "rollout_converged_path": f"{self.state}/converged.json",
            "rollout_report_dir": str(self.reports),
            "sglang_service_state_dir": str(tmp_path / "sglang"),
            "ab_report_dir": str(tmp_path / "ab"),
        }

    def run(self, playbook: Path, *extra: str) -> subprocess.CompletedProcess:
        if self.log.exists():
            self.log.unlink()
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_FACT_CACHING="memory",
                   ANSIBLE_CALLBACK_PLUGINS=f"{ROOT / 'callback_plugins'}:{self.tmp / 'probe'}",
                   ANSIBLE_CALLBACKS_ENABLED="rollout_outcome,lock_probe",
                   PROBE_LOG=str(self.log), PROBE_CONTROLLER_LOCK=str(self.controller_lock),
                   PROBE_HOST_LOCK=str(self.host_lock))
        return subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(self.tmp / "inventory" / "hosts.yml"),
             str(playbook), "-e", json.dumps(self.variables), *extra],
            env=env, capture_output=True, text=True, timeout=600, check=False, cwd=self.tmp,
        )

    def probe(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def files(self) -> dict[str, str]:
        """Every file the runs may write (state, reports, A/B reports, release dirs), with its content."""
        out = {}
        for top in ("state", "reports", "ab", "sglang"):
            for path in sorted((self.tmp / top).rglob("*")):
                if path.is_file():
                    out[str(path.relative_to(self.tmp))] = path.read_text(errors="replace")
        return out


def pid_start(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def record(pid: int, start: str | None, playbooks: list[str]) -> dict:
    """A lock record as library/fleet_run_lock.py writes it, of another run on this controller."""
    return {"owner": "alice@ops-laptop", "controller": "ops-laptop", "controller_id": lock.controller_id(),
            "pid": pid, "pid_start": start, "run_id": HOLDER_RUN, "started": "2027-01-01T00:00:00Z",
            "started_epoch": 1798761600, "playbooks": playbooks}


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


@pytest.fixture
def sleeper():
    """A live process of this controller that holds the lock; stopped by its PID afterwards."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc.pid
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def plant(fleet: Fleet, held: dict) -> None:
    for path in (fleet.controller_lock, fleet.host_lock):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(held, indent=2) + "\n")
        path.chmod(0o600)


@pytest.mark.parametrize(
    ("playbook", "plays_before_refusal"),
    [
        # site.yml's continue play has no hosts without -e rollout_continue; it still starts.
        # The install phases left out publish their records' outputs before preflight (read-only; here
        # the inventory puts the host into their groups without a record, and they publish nothing).
        ("site.yml", ["Continue a paused run - every host serves what the paused run left it on",
                      "Converged hosts skip the run (their recorded release is the desired one, nothing drifted)",
                      "ROCm phase left out where the host's record holds it",
                      "The venv phase left out where the host's record holds it",
                      "The models phase left out where the host's record holds it",
                      "Preflight every host before changing any", TAKE_PLAY]),
        ("playbooks/venv.yml", [TAKE_PLAY]),
        ("playbooks/rocm.yml", [TAKE_PLAY]),
        ("playbooks/ab_benchmark.yml", ["A/B | take the run lock before anything is changed"]),
    ],
)
def test_a_second_run_is_refused_before_it_changes_anything(fleet: Fleet, sleeper: int, playbook: str,
                                                            plays_before_refusal: list[str]) -> None:
    held = record(sleeper, pid_start(sleeper), ["rollout.yml"])
    plant(fleet, held)
    before = fleet.files()
    # site.yml's preflight runs before its lock play; this machine is no GPU host, so it is skipped
    # (it only reads; test_a_refused_input_under_site_yml_leaves_no_lock_anywhere runs it).
    run = fleet.run(ROOT / playbook, *(["--skip-tags", "preflight"] if playbook == "site.yml" else []))
    assert run.returncode != 0, run.stdout[-3000:]
    assert "ROLLOUT REFUSED: another run holds the lock, or it cannot be checked; nothing was changed." in run.stdout
    holder = f"locked by run {HOLDER_RUN} of alice@ops-laptop (pid {sleeper}, rollout.yml)"
    assert f"the controller ({fleet.controller_lock}): {holder}" in run.stdout, run.stdout[-3000:]
    assert f"host node-1 ({fleet.host_lock}): {holder}" in run.stdout
    assert f"still running on this controller. Wait for it to finish, or stop that run (kill {sleeper}) first." \
        in run.stdout
    # Nothing was written or changed: the holder's locks as planted, no report, no release, no A/B file.
    assert fleet.files() == before
    assert json.loads(fleet.host_lock.read_text()) == held
    # No play after the lock play started (a phase, the A/B itself); site.yml's read-only preflight
    # comes before it.
    assert [entry["play"] for entry in fleet.probe()] == [*plays_before_refusal, "END"]


def test_a_phase_run_alone_takes_the_lock_and_releases_it_at_its_end(fleet: Fleet) -> None:
    run = fleet.run(ROOT / "playbooks" / "venv.yml", "--tags", "lock")
    assert run.returncode == 0, run.stdout[-3000:]
    notes = {entry["play"]: entry["locks"] for entry in fleet.probe()}
    held = notes["SGLang virtualenv release"]
    assert held["controller"] is not None
    assert held["controller"] == held["host"]
    assert held["controller"]["playbooks"] == ["venv.yml"]
    assert held["controller"]["pid"] != os.getpid()
    assert notes["END"] == {"controller": None, "host": None}
    assert not fleet.controller_lock.exists()
    assert not fleet.host_lock.exists()


def test_under_site_yml_the_lock_is_taken_once_and_only_the_end_of_the_run_releases_it(fleet: Fleet) -> None:
    run = fleet.run(ROOT / "site.yml", "--tags", "lock")
    assert run.returncode == 0, run.stdout[-3000:]
    probe = fleet.probe()
    plays = [entry["play"] for entry in probe]
    # site.yml's own lock play, then rocm/venv/models each with its lock and release plays, the
    # rollout's plays, and site.yml's release play last.
    assert plays.count(TAKE_PLAY) == 4, plays
    assert plays.count(RELEASE_PLAY) == 4, plays
    first, last = plays.index(TAKE_PLAY), len(plays) - 1 - plays[::-1].index(RELEASE_PLAY)
    assert probe[first]["locks"] == {"controller": None, "host": None}
    taken = probe[first + 1]["locks"]["controller"]
    assert taken is not None
    assert taken["playbooks"] == ["site.yml"]
    # The same record on the controller and the host at the start of every later play, up to and
    # including site.yml's release play: no phase took a second lock or released it early.
    for entry in probe[first + 1:last + 1]:
        assert entry["locks"] == {"controller": taken, "host": taken}, entry["play"]
    assert probe[-1] == {"play": "END", "locks": {"controller": None, "host": None}}
    said = " ".join(run.stdout.split())
    # The phases' lock and release plays include nothing while site.yml holds the lock: the lock
    # entry point runs once (site.yml's take), the unlock entry point once (site.yml's release).
    assert said.count("Validating arguments against arg spec 'lock'") == 1, said[-3000:]
    assert said.count("Validating arguments against arg spec 'unlock'") == 1, said[-3000:]
    assert "The run lock is held by this run already" not in said


SITE_WITH_ROLLOUT_OPEN = """
- name: The run lock, for the whole run (as site.yml imports it)
  ansible.builtin.import_playbook: {root}/playbooks/run_lock.yml
  vars:
    rollout_lock_scope: site.yml
- name: The phases before the rollout take time (the run id is the time the lock was taken)
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Later than the lock's second
      ansible.builtin.pause: {{seconds: 2}}
- name: Rollout | open the run record on the controller (as playbooks/rollout.yml's first play)
  hosts: sglang_hosts
  gather_facts: false
  tasks:
    - name: Open
      ansible.builtin.include_role: {{name: rollout, tasks_from: open}}
      vars:
        rollout_lock_scope: rollout.yml
- name: Rollout | summary (as playbooks/rollout.yml's release)
  hosts: sglang_hosts
  gather_facts: false
  tasks:
    - name: Release as rollout.yml does
      ansible.builtin.include_role: {{name: rollout, tasks_from: unlock}}
      vars:
        rollout_lock_scope: rollout.yml
- name: Release the run lock, at the end of the run (as site.yml imports it)
  ansible.builtin.import_playbook: {root}/playbooks/run_unlock.yml
  vars:
    rollout_lock_scope: site.yml
"""


def test_the_rollout_phase_reuses_the_runs_lock_and_reports_its_takeovers(fleet: Fleet) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    plant(fleet, record(dead.pid, None, ["site.yml"]))
    playbook = fleet.tmp / "site_open.yml"
    playbook.write_text(SITE_WITH_ROLLOUT_OPEN.format(root=ROOT), encoding="utf-8")
    run = fleet.run(playbook)
    assert run.returncode == 0, run.stdout[-3000:]
    probe = fleet.probe()
    taken = next(entry["locks"]["host"] for entry in probe if entry["play"].startswith("Rollout | open"))
    assert taken["run_id"] != HOLDER_RUN
    assert taken["playbooks"] == ["site_open.yml"]
    (run_dir,) = [p for p in fleet.reports.iterdir() if p.is_dir()]
    assert run_dir.name == taken["run_id"]
    run_json = json.loads((run_dir / "run.json").read_text())
    assert run_json["run_id"] == taken["run_id"]
    assert run_json["lock"] == taken
    assert run_json["locked"] == ["node-1"]
    warnings = run_json["lock_warnings"]
    assert len(warnings) == 2, warnings
    assert warnings[1].startswith(f"host node-1 ({fleet.host_lock}): taking over a stale lock: run {HOLDER_RUN} of "
                                  "alice@ops-laptop")
    report = (run_dir / "rollout.md").read_text()
    assert "## Run lock" in report
    assert f"taking over a stale lock: run {HOLDER_RUN}" in report
    # rollout.yml's own release (scope rollout.yml) left site.yml's lock held; site.yml's end released it.
    final = next(entry for entry in probe if entry["play"] == RELEASE_PLAY)
    assert final["locks"] == {"controller": taken, "host": taken}
    assert probe[-1]["locks"] == {"controller": None, "host": None}
    assert json.loads((run_dir / "outcome.json").read_text())["locks"]["left"] == []


def test_a_refused_input_under_site_yml_leaves_no_lock_anywhere(fleet: Fleet) -> None:
    # preflight finds the bad setting (roles/rocm's rocm_reboot is a bool) and stops the run before
    # site.yml's lock play: nothing on the host or the controller changed, not even a lock.
    before = fleet.files()
    failed = fleet.run(ROOT / "site.yml", "-e", '{"rocm_reboot": "maybe"}')
    assert failed.returncode != 0
    assert "rocm_reboot" in failed.stdout, failed.stdout[-3000:]
    assert TAKE_PLAY not in [entry["play"] for entry in fleet.probe()]
    assert not fleet.controller_lock.exists()
    assert not fleet.host_lock.exists()
    assert fleet.files() == before


def test_a_run_that_died_holding_the_lock_is_taken_over_by_the_next_run_with_a_warning(fleet: Fleet) -> None:
    # A site.yml run that failed in a phase after the lock play (or was killed) left its locks: its
    # pid no longer runs on this controller.
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = record(dead.pid, None, ["site.yml"])
    plant(fleet, left)
    after = fleet.run(ROOT / "site.yml", "--tags", "lock")
    assert after.returncode == 0, after.stdout[-3000:]
    assert "WARNING (run lock):" in after.stdout
    for where in (f"the controller ({fleet.controller_lock})", f"host node-1 ({fleet.host_lock})"):
        assert (f"{where}: taking over a stale lock: run {left['run_id']} of {left['owner']} "
                f"(pid {left['pid']}, site.yml)") in after.stdout
    assert after.stdout.count("that process no longer runs on this controller (the run ended without releasing it, "
                              "e.g. halted or killed)") == 2
    assert not fleet.controller_lock.exists()
    assert not fleet.host_lock.exists()


def test_a_failed_ab_releases_the_run_lock(fleet: Fleet) -> None:
    # The host has no current release of the instance: the A/B stops there (nothing was changed).
    run = fleet.run(ROOT / "playbooks" / "ab_benchmark.yml")
    assert run.returncode != 0
    assert "node-1 has no current release of instance main" in run.stdout, run.stdout[-3000:]
    probe = fleet.probe()
    during = next(entry for entry in probe if entry["play"].startswith("A/B | HiCache arguments"))
    assert during["locks"]["host"] is not None
    assert during["locks"]["host"]["playbooks"] == ["ab_benchmark.yml"]
    assert probe[-1]["locks"] == {"controller": None, "host": None}
    assert not fleet.controller_lock.exists()
    assert not fleet.host_lock.exists()


LOCK_AROUND_A_PLAY = """
- name: The run lock (as site.yml imports it)
  ansible.builtin.import_playbook: {root}/playbooks/run_lock.yml
  vars:
    rollout_lock_scope: site.yml
- name: Where a phase would run
  hosts: sglang_hosts
  gather_facts: false
  tags: [always]
  tasks:
    - name: Nothing
      ansible.builtin.meta: noop
- name: Release the run lock (as site.yml imports it)
  ansible.builtin.import_playbook: {root}/playbooks/run_unlock.yml
  vars:
    rollout_lock_scope: site.yml
"""


@pytest.mark.parametrize(("tags", "locked"), [("preflight", False), ("preflight,rocm", True), ("lock", True)])
def test_a_run_of_read_only_tags_alone_takes_no_lock(fleet: Fleet, tags: str, locked: bool) -> None:
    # `site.yml --tags preflight` changes nothing on any host: it takes no lock (a run that holds
    # one would refuse nothing else meanwhile). A tag of a phase that changes hosts takes it.
    playbook = fleet.tmp / "lock_around.yml"
    playbook.write_text(LOCK_AROUND_A_PLAY.format(root=ROOT), encoding="utf-8")
    run = fleet.run(playbook, "--tags", tags)
    assert run.returncode == 0, run.stdout[-3000:]
    during = next(entry["locks"] for entry in fleet.probe() if entry["play"] == "Where a phase would run")
    if locked:
        assert during["controller"] is not None
        assert during["controller"] == during["host"]
        assert during["controller"]["playbooks"] == ["lock_around.yml"]
    else:
        assert during == {"controller": None, "host": None}
    assert not fleet.controller_lock.exists()
    assert not fleet.host_lock.exists()
