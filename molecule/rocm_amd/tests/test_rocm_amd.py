"""Verify the rendered `amd` source on a real test host: ansible.builtin.deb822_repository wrote the
deb822 sources naming AMD's URIs for the pinned ROCm release (7.2.1), its graphics repository (ROCm
7.x) and the amdgpu release AMD pairs with it (30.30.1) with the Ubuntu suite, the test key inline in
Signed-By; apt parses them and AMD's origin is pinned at 600."""

import os
from pathlib import Path

import pytest
import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

# ROCm 7.2.1 (converge.yml sets only rocm_version): the role's table gives amdgpu 30.30.1 and the
# graphics repository 7.2.1 (../shared/docs/radeon-stack.md).
SOURCES = {
    "rocm": "https://repo.radeon.com/rocm/apt/7.2.1",
    "rocm-graphics": "https://repo.radeon.com/graphics/7.2.1/ubuntu",
    "amdgpu": "https://repo.radeon.com/amdgpu/30.30.1/ubuntu",
}


def deb822(text):
    """Fields of a one-stanza deb822 file; continuation lines (a leading space) join their field."""
    fields = {}
    key = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line[0] in " \t" and key:
            fields[key] += "\n" + line.strip()
            continue
        key, _, value = line.partition(":")
        key = key.strip()
        fields[key] = value.strip()
    return fields


def test_signed_by_is_the_test_key(host):
    # deb822_repository writes an armored key given in signed_by into Signed-By itself (continuation
    # lines, an empty line as "."): it must be the throwaway key prepare.yml made, verbatim.
    fields = deb822(host.file("/etc/apt/sources.list.d/rocm.sources").content_string)
    armored = "\n".join("" if line == "." else line for line in fields["Signed-By"].splitlines()).strip()
    key = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "rocm-test-key.asc").read_text()
    assert armored.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----"), armored[:80]
    assert [line.strip() for line in armored.splitlines()] == [line.strip() for line in key.strip().splitlines()]
    # The hand-dearmored keyring of earlier versions is gone.
    assert not host.file("/etc/apt/keyrings/rocm.gpg").exists


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
    assert fields["Signed-By"].startswith("\n-----BEGIN PGP PUBLIC KEY BLOCK-----") or fields["Signed-By"].startswith(
        "-----BEGIN PGP PUBLIC KEY BLOCK-----")
    assert fields["X-Repolib-Name"] == name
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
