"""The rollback rulebook (extensions/eda/rulebooks/rollback_validated.yml) run by the real
ansible-rulebook (`make eda`: .cache/eda-venv, Java 17), fed an Alertmanager notification POSTed
to its webhook on 127.0.0.1, and the real playbooks/rollback_validated.yml it runs.

The `ansible.eda` collection is on no registry this project reaches: its `alertmanager` source is a
stand-in (tests/eda/alertmanager_standin.py, installed as that collection in a temporary collections
path), so the rulebook file runs unchanged. Everything after the source is real: ansible-rulebook's
rule engine (conditions, throttle), its run_playbook action (extra vars, the host limit from the
event, ansible-runner), the playbook through roles/rollout `open`, the run lock and the report, on
two local hosts (ansible_connection local, state under tmp_path). node-2 serves its validated
release, so the playbook finds nothing to roll back; the restart and the gate are molecule's
(molecule/rollout_gate, docs/event-driven.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from procs import free_port, stop_by_pid

ROOT = Path(__file__).resolve().parents[2]
EDA_BIN = ROOT / ".cache" / "eda-venv" / "bin"
STANDIN = Path(__file__).with_name("alertmanager_standin.py")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.shared_state,
    pytest.mark.skipif(not (EDA_BIN / "ansible-rulebook").exists(),
                       reason="ansible-rulebook is not installed: `make eda` (.cache/eda-venv, about 10 s)"),
    pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                       reason="ansible-rulebook needs Java 17 (Debian's openjdk-17-jre-headless)"),
]

CONFIG_HASH = hashlib.sha256(b"validated release of node-2").hexdigest()


def alert(name: str, host: str, status: str = "firing", instance: str = "main") -> dict:
    return {
        "status": status,
        "labels": {"alertname": name, "fleet_host": host, "sglang_instance": instance,
                   "instance": "127.0.0.1:30004", "severity": "warning"},
        "annotations": {"summary": f"{name} on {host}/{instance}"},
        "startsAt": "2026-12-04T08:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.invalid/graph",
        "fingerprint": hashlib.sha256(f"{name}{host}{instance}".encode()).hexdigest()[:16],
    }


def notification(alerts: list[dict]) -> dict:
    """Alertmanager's webhook body (version 4)."""
    return {
        "version": "4", "groupKey": "{}:{alertname=~\"SGLang.*|HiCache.*\"}", "truncatedAlerts": 0,
        "status": "firing", "receiver": "hicache-fleet-rollback", "groupLabels": {},
        "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://alertmanager.invalid",
        "alerts": alerts,
    }


def fleet(tmp_path: Path) -> tuple[Path, Path, str]:
    """Two local hosts; node-2 has a validation record and serves that release (current -> it).
    Returns the inventory, the report directory and the -e that puts the hosts' state under tmp_path
    (the role variable _rollout_host_state_dir outranks the inventory, as in tests/rollout)."""
    state, sglang = tmp_path / "node-2" / "state", tmp_path / "node-2" / "sglang"
    state.mkdir(parents=True)
    hosts = {name: {"ansible_connection": "local", "ansible_host": "127.0.0.1",
                    "ansible_python_interpreter": sys.executable} for name in ("node-1", "node-2")}
    release = sglang / "main" / "releases" / CONFIG_HASH[:12]
    release.mkdir(parents=True)
    (release / "release.json").write_text(json.dumps(
        {"name": "main", "unit": "sglang-main.service", "bind": "127.0.0.1", "port": 30004,
         "profile": "seed-validated", "hicache": True, "config_hash": CONFIG_HASH}), encoding="utf-8")
    (sglang / "main" / "current").symlink_to(release)
    (state / "validated.json").write_text(json.dumps(
        {"instances": {"main": {"instance": "main", "unit": "sglang-main.service", "config_hash": CONFIG_HASH,
                                "probe": {"input_len": 2048}}}, "host_release": {}}), encoding="utf-8")
    inventory = tmp_path / "inventory" / "hosts.yml"
    inventory.parent.mkdir()
    inventory.write_text(json.dumps({"sglang_hosts": {"hosts": hosts}}), encoding="utf-8")
    reports = tmp_path / "reports"
    extra = json.dumps({
        "_rollout_host_state_dir": str(state), "rollout_lock_path": f"{state}/rollout.lock",
        "rollout_record_path": f"{state}/validated.json", "rollout_converged_path": f"{state}/converged.json",
        "sglang_service_state_dir": str(sglang), "rollout_report_dir": str(reports)})
    return inventory, reports, extra


def playbook(tmp_path: Path, inventory: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FACT_CACHING="memory")
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
         str(ROOT / "playbooks" / "rollback_validated.yml"), *args],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False)


def flat(text: str) -> str:
    """Ansible's YAML output folds long messages: compare with whitespace runs as one space."""
    return " ".join(text.split())


def wait_up(proc: subprocess.Popen, url: str, log: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"ansible-rulebook exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the rulebook's webhook never answered on {url}:\n{log.read_text()[-3000:]}")


def wait_for(predicate, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    pytest.fail(f"{what} within {timeout_s} s:\n{log.read_text()[-4000:]}")


@pytest.fixture
def rulebook(tmp_path):
    """Starts ansible-rulebook on the shipped rulebook; yields (port, reports dir, log); stops it by PID.

    ansible-rulebook passes the playbook only the rule's extra vars, so the hosts' state cannot be
    moved under tmp_path here: node-2 is an SSH host on a closed loopback port (unreachable), and the
    run stops there, after the rulebook chose it and the playbook opened its run; nothing local is
    touched. The path where node-2 is reached and rolled back is the direct tests' and molecule's."""
    collection = tmp_path / "collections" / "ansible_collections" / "ansible" / "eda"
    source = collection / "extensions" / "eda" / "plugins" / "event_source"
    source.mkdir(parents=True)
    shutil.copy(STANDIN, source / "alertmanager.py")
    (collection / "MANIFEST.json").write_text(json.dumps(
        {"collection_info": {"namespace": "ansible", "name": "eda", "version": "0.0.0"}, "format": 1}))
    closed = free_port()
    hosts = {name: {"ansible_host": "127.0.0.1", "ansible_port": closed, "ansible_user": "nobody",
                    "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
                                               " -o BatchMode=yes -o ConnectTimeout=3"}
             for name in ("node-1", "node-2")}
    inventory = tmp_path / "inventory" / "hosts.yml"
    inventory.parent.mkdir()
    inventory.write_text(json.dumps({"sglang_hosts": {"hosts": hosts}}), encoding="utf-8")
    reports = tmp_path / "reports"
    port = free_port()
    variables = tmp_path / "eda-vars.yml"
    variables.write_text(json.dumps({"rollback_eda_host": "127.0.0.1", "rollback_eda_port": port,
                                     "rollback_eda_report_dir": str(reports)}), encoding="utf-8")
    # The operator's command (scripts/eda-rollback.sh), with this pytest's ansible-playbook as the controller's.
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FACT_CACHING="memory",
               ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "collections"), CONTROLLER_BIN=str(Path(sys.executable).parent))
    log = tmp_path / "ansible-rulebook.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(ROOT / "scripts" / "eda-rollback.sh"), "-i", str(inventory), "-e", str(variables), "--print-events"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_up(proc, f"http://127.0.0.1:{port}/", log)
        yield port, reports, log
    finally:
        stop_by_pid(proc, grace_s=20)


def post(port: int, body: dict) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/alerts", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status


def run_dirs(reports: Path) -> list[Path]:
    return sorted(p for p in reports.glob("*") if p.is_dir()) if reports.exists() else []


def test_a_firing_toolkit_alert_runs_the_rollback_for_its_host_once_and_nothing_else_fires(rulebook):
    port, reports, log = rulebook
    assert post(port, notification([
        alert("SGLangTTFTRegressed", "node-2"),
        # Not ours, or not firing: no rule matches.
        alert("SGLangInstanceDown", "node-1"),
        alert("HiCacheHostTierStopped", "node-1", status="resolved"),
        # The same host again (another instance, another alert): throttled, no second run.
        alert("HiCacheHostTierStopped", "node-2", instance="other"),
    ])) == 202
    wait_for(lambda: "PLAY RECAP" in log.read_text(), 180, "the rollback playbook did not run", log)
    time.sleep(10)  # a second (throttled) run would have started by now
    text = log.read_text()
    output = flat(text)
    # One run: ansible-rulebook streams its output, then logs it again as the failed action's error.
    assert text.count("ansible_rulebook.action.run_playbook - ERROR") == 1, text[-4000:]
    assert text.count("TASK [Rollback to validated | which host and why]") == 2, text[-4000:]
    # The run is the host's alone (the event's fleet_host: extra var and --limit), with the alert as its reason.
    assert ("rolling node-2 back to its last validated release: Alertmanager: SGLangTTFTRegressed firing on"
            " node-2/main since 2026-12-04T08:00:00Z") in output, text[-4000:]
    recap = text.split("PLAY RECAP")[1]
    assert "node-2" in recap
    assert "node-1" not in recap
    # The playbook ran with the toolkit's callback (scripts/eda-rollback.sh keeps it on ansible-runner's path).
    assert "Skipping callback plugin 'rollout_outcome'" not in text
    # It reached the fleet's run lock and, the host being unreachable, refused before writing anything.
    assert "ROLLOUT REFUSED: another run holds the lock, or it cannot be checked; nothing was changed." in output
    assert "host node-2 (/var/lib/hicache-fleet/rollout.lock): unreachable" in output
    assert run_dirs(reports) == []
    assert not (reports / "rollout.lock").exists()


def test_an_alert_for_a_host_outside_the_inventory_changes_nothing(rulebook):
    port, reports, log = rulebook
    assert post(port, notification([alert("SGLangTTFTRegressed", "ghost-9")])) == 202
    wait_for(lambda: "ghost-9" in log.read_text().split("[received event]", 1)[-1]
             and "could not match supplied host pattern" in log.read_text().lower(),
             120, "the playbook run for ghost-9 was not refused", log)
    time.sleep(3)
    assert run_dirs(reports) == [], "a run was opened for a host outside the inventory"


def test_the_rollback_playbook_refuses_before_anything_is_read_or_locked(tmp_path):
    inventory, reports, extra = fleet(tmp_path)
    cases = {
        "rollback_host is not set": [],
        "rollback_host=node-7 is not a host of sglang_hosts": ["-e", "rollback_host=node-7"],
        "--limit leaves rollback_host=node-2 out of this run": ["-e", "rollback_host=node-2", "--limit", "node-1"],
        "rollout_report_dir must be the fleet's report directory": [
            "-e", "rollback_host=node-2", "-e", "rollback_source=ansible-rulebook", "-e", "rollout_report_dir=reports"],
    }
    for message, args in cases.items():
        run = playbook(tmp_path, inventory, "-e", extra, *args)
        assert run.returncode != 0, run.stdout
        assert message in flat(run.stdout), run.stdout[-3000:]
        assert "Nothing was read, locked or changed" in flat(run.stdout)
    assert not reports.exists()
    assert not list(tmp_path.rglob("rollout.lock"))


def test_a_host_on_its_validated_release_is_reported_unchanged_under_the_run_lock(tmp_path):
    inventory, reports, extra = fleet(tmp_path)
    run = playbook(tmp_path, inventory, "-e", extra, "-e", json.dumps(
        {"rollback_host": "node-2", "rollback_reason": "SGLangTTFTRegressed firing on node-2/main"}))
    assert run.returncode == 0, run.stdout[-4000:]
    assert "every instance serves its last validated release already: nothing to roll back" in flat(run.stdout)
    (run_dir,) = run_dirs(reports)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["hosts"] == ["node-2"]
    assert meta["locked"] == ["node-2"]
    assert "SGLangTTFTRegressed firing on node-2/main" in meta["note"]
    host = json.loads((run_dir / "hosts" / "node-2.json").read_text())
    assert host["verdict"] == "unchanged"
    assert "nothing was rolled back or restarted" in host["note"]
    assert "every host passed or was already validated" in (run_dir / "rollout.md").read_text()
    assert not list(tmp_path.rglob("rollout.lock"))


def test_no_record_or_a_pruned_validated_release_is_refused_and_reported(tmp_path):
    inventory, reports, extra = fleet(tmp_path)
    release = tmp_path / "node-2" / "sglang" / "main" / "releases" / CONFIG_HASH[:12]
    (release / "release.json").unlink()
    run = playbook(tmp_path, inventory, "-e", extra, "-e", "rollback_host=node-2")
    assert run.returncode != 0
    assert "the validated release of main is no longer under" in flat(run.stdout), run.stdout[-3000:]
    (run_dir,) = run_dirs(reports)
    assert json.loads((run_dir / "hosts" / "node-2.json").read_text())["verdict"] == "failed"
    assert not list(tmp_path.rglob("rollout.lock"))
    (tmp_path / "node-2" / "state" / "validated.json").unlink()
    run = playbook(tmp_path, inventory, "-e", extra, "-e", "rollback_host=node-2")
    assert run.returncode != 0
    assert "has no validation record" in flat(run.stdout), run.stdout[-3000:]


def test_check_mode_says_what_it_would_roll_back_and_changes_nothing(tmp_path):
    inventory, reports, extra = fleet(tmp_path)
    # node-2 now serves another release than the one it validated.
    main = tmp_path / "node-2" / "sglang" / "main"
    other = main / "releases" / "0123456789ab"
    other.mkdir()
    (main / "current").unlink()
    (main / "current").symlink_to(other)
    run = playbook(tmp_path, inventory, "-e", extra, "-e", "rollback_host=node-2", "--check")
    assert run.returncode == 0, run.stdout[-4000:]
    assert f"would roll back (check mode): main: 0123456789ab -> {CONFIG_HASH[:12]}" in flat(run.stdout)
    assert os.readlink(main / "current") == str(other)
    (run_dir,) = run_dirs(reports)
    assert json.loads((run_dir / "run.json").read_text())["check_mode"] is True
    host = json.loads((run_dir / "hosts" / "node-2.json").read_text())
    assert host["verdict"] == "would be rolled back (check mode)"
    assert not list(tmp_path.rglob("rollout.lock"))
