"""Verify on the real test hosts: systemd is running, sshd listens on the host's own loopback
address, and preflight (converge, idempotence and the bad-input runs) changed nothing."""

import os

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
