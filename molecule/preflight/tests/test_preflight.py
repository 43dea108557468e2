"""Verify on the real test hosts: systemd is running, sshd listens on the host's own loopback
address, preflight (converge, idempotence and the bad-input runs) changed nothing, and every bad
input of side_effect.yml was refused by preflight with its message."""

import json
import os
from pathlib import Path

import pytest
import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

# Places a misbehaving role would write to; /var/tmp holds the marker itself.
WATCHED = ["/etc", "/opt", "/srv", "/usr", "/var/lib", "/home", "/root"]


@pytest.fixture
def address(host):
    return host.ansible.get_variables()["ansible_host"]


def test_systemd_is_running(host):
    state = host.run("systemctl is-system-running").stdout.strip()
    assert state == "running", host.run("systemctl --failed --no-pager").stdout


def test_pid1_is_systemd(host):
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"


def test_sshd_listens_on_own_loopback_address(host, address):
    assert address.startswith("127.")
    assert host.socket(f"tcp://{address}:22").is_listening
    assert not host.socket("tcp://0.0.0.0:22").is_listening


def test_preflight_changed_nothing(host):
    marker = "/var/tmp/preflight-marker"
    assert host.file(marker).exists
    newer = host.run(
        "find %s -xdev -newer %s -not -path '/root/.ansible*' -print 2>/dev/null | head -20",
        " ".join(WATCHED),
        marker,
    ).stdout.split()
    assert newer == [], f"preflight changed files: {newer}"


def _bad_inputs() -> list:
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "bad_inputs.json"
    assert path.exists(), f"{path} is missing: run `molecule side-effect -s preflight` before verify"
    return json.loads(path.read_text())


def test_at_least_15_distinct_bad_inputs_each_refused_in_preflight_with_its_message():
    runs = _bad_inputs()
    assert len({json.dumps(case["vars"], sort_keys=True) for case, _, _ in runs}) >= 15
    for case, rc, stdout in runs:
        output = " ".join(stdout.split())
        assert rc != 0, (case["name"], stdout[-2000:])
        # Refused by preflight's summary task, the first play of the run: no other play started.
        assert "TASK [preflight : Fail with every finding on this host]" in stdout, case["name"]
        assert stdout.count("PLAY [") == 1, case["name"]
        for words in case["expect"]:
            assert words in output, (case["name"], words, stdout[-2000:])
        for words in case.get("not_expect", []):
            assert words not in output, (case["name"], words, stdout[-2000:])
