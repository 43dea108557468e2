"""Verify the rendered `amd` source on a real test host: the dearmored keyring holds the test key,
the deb822 sources name AMD's URIs for the pinned ROCm and amdgpu releases with the Ubuntu suite and
Signed-By the keyring, apt parses them, and AMD's origin is pinned at 600."""

import os

import pytest
import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

KEYRING = "/etc/apt/keyrings/rocm.gpg"
SOURCES = {
    "rocm": "https://repo.radeon.com/rocm/apt/7.1.1",
    "amdgpu": "https://repo.radeon.com/amdgpu/30.20.1/ubuntu",
}


def deb822(text):
    fields = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


def test_keyring_is_dearmored_test_key(host):
    keyring = host.file(KEYRING)
    assert keyring.exists
    assert keyring.mode == 0o644
    assert keyring.user == "root"
    # Binary OpenPGP, not armor: the first byte is a packet tag, not "-----BEGIN".
    assert not keyring.content.startswith(b"-----BEGIN")
    shown = host.run(f"gpg --batch --show-keys {KEYRING}")
    assert shown.rc == 0, shown.stderr
    assert "hicache-fleet rocm_amd test key" in shown.stdout
    assert host.file("/etc/apt/keyrings").mode == 0o755


@pytest.mark.parametrize(("name", "uri"), sorted(SOURCES.items()))
def test_deb822_source(host, name, uri):
    source = host.file(f"/etc/apt/sources.list.d/{name}.sources")
    assert source.exists
    assert source.mode == 0o644
    fields = deb822(source.content_string)
    assert fields["Types"] == "deb"
    assert fields["URIs"] == uri
    assert fields["Suites"] == "noble"
    assert fields["Components"] == "main"
    assert fields["Architectures"] == "amd64"
    assert fields["Signed-By"] == KEYRING
    assert not host.file(f"/etc/apt/sources.list.d/{name}.list").exists


def test_apt_parses_the_sources(host):
    # indextargets reads every configured source without downloading anything.
    result = host.run("apt-get indextargets --no-release-info --format '$(REPO_URI) $(RELEASE)'")
    assert result.rc == 0, result.stderr
    assert "E:" not in result.stderr, result.stderr
    assert "W:" not in result.stderr, result.stderr
    for uri in SOURCES.values():
        assert f"{uri}/ noble" in result.stdout, result.stdout


def test_pin_priority_600(host):
    pin = host.file("/etc/apt/preferences.d/rocm-pin-600")
    assert pin.exists
    assert pin.mode == 0o644
    fields = deb822(pin.content_string)
    assert fields == {"Package": "*", "Pin": "release o=repo.radeon.com", "Pin-Priority": "600"}
    policy = host.run("apt-cache policy")
    assert policy.rc == 0, policy.stderr
    assert "E:" not in policy.stderr, policy.stderr


def test_nothing_installed_from_amd(host):
    for package in ("amdgpu-dkms", "rocm", "rocminfo"):
        assert not host.package(package).is_installed


def test_service_user_in_gpu_groups(host):
    groups = host.user("sglang").groups
    assert "render" in groups
    assert "video" in groups
