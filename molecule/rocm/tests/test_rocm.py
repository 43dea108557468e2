"""Verify rocm (distro source) on a real test host: Debian's ROCm tools are installed and run
(rocminfo answers with its own no-GPU error), the GPU groups exist, the service user was created
as a system user in them, and a user that existed before kept its shell and home."""

import hashlib
import json
import os

import pytest
import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")


@pytest.mark.parametrize("package", ["rocminfo", "rocm-smi"])
def test_distro_rocm_packages_installed(host, package):
    pkg = host.package(package)
    assert pkg.is_installed
    # bookworm ships ROCm 5.2.x; the distro source must not have pulled anything from AMD.
    assert pkg.version.startswith("5."), pkg.version


def test_no_amd_repository_configured(host):
    assert not host.file("/etc/apt/sources.list.d/rocm.sources").exists
    assert not host.file("/etc/apt/preferences.d/rocm-pin-600").exists


def test_rocminfo_runs_and_reports_no_gpu(host):
    result = host.run("rocminfo")
    # No GPU and no amdgpu module in a container: rocminfo's own error, not "command not found".
    assert result.rc == 1, result
    assert "ROCk module is NOT loaded" in result.stdout + result.stderr


def test_rocm_smi_runs(host):
    result = host.run("rocm-smi")
    assert result.rc != 127, result.stderr
    assert "amdgpu" in result.stdout + result.stderr


@pytest.mark.parametrize("group", ["render", "video"])
def test_gpu_group_exists(host, group):
    assert host.group(group).exists


def test_service_user_created_as_system_user(host):
    user = host.user("sglang")
    assert user.exists
    assert user.uid < 1000
    assert user.home == "/var/lib/sglang"
    assert user.shell == "/usr/sbin/nologin"
    assert host.file("/var/lib/sglang").is_directory
    assert host.file("/var/lib/sglang").user == "sglang"


@pytest.mark.parametrize("name", ["sglang", "ops"])
def test_service_user_in_gpu_groups(host, name):
    groups = host.user(name).groups
    assert "render" in groups, groups
    assert "video" in groups, groups


def test_existing_user_kept_its_account(host):
    user = host.user("ops")
    assert user.shell == "/bin/bash"
    assert user.home == "/home/ops"
    assert user.uid >= 1000


def test_activated_release_is_recorded_and_installed(host):
    # The side effect ends with the desired release (rocminfo, rocm-smi, librocm-smi-dev) activated.
    record = json.loads(host.file("/var/lib/hicache-fleet/rocm-release.json").content_string)
    release = record["release"]
    assert release == {"source": "distro", "packages": {"rocminfo": None, "rocm-smi": None, "librocm-smi-dev": None}}
    # The id is the documented one: sha256 of the release's canonical JSON, 12 hex digits.
    canonical = json.dumps(release, sort_keys=True, separators=(",", ":"))
    assert record["id"] == hashlib.sha256(canonical.encode()).hexdigest()[:12]
    assert host.package("librocm-smi-dev").is_installed
    assert host.file("/usr/include/rocm_smi/rocm_smi.h").exists


def test_staged_package_files_are_gone_after_the_activations(host):
    # Every release the scenario staged was activated in the end: stage's record and the .deb files it
    # downloaded into apt's cache (rocminfo and rocm-smi in converge, librocm-smi-dev, pciutils in the
    # side effect) are removed. The side effect shows them on disk before each activation.
    assert not host.file("/var/lib/hicache-fleet/rocm-staged.json").exists
    left = host.run("ls /var/cache/apt/archives")
    assert left.rc == 0, left.stderr
    staged = [name for name in left.stdout.split()
              if name.split("_")[0] in ("rocminfo", "rocm-smi", "librocm-smi-dev", "pciutils")]
    assert staged == [], left.stdout


def test_no_reboot_mark_and_no_amdgpu_loaded(host):
    # The scenario's last activation changed no driver, and the guest rebooted since the driver changed.
    assert not host.file("/run/hicache-fleet/rocm-reboot-required").exists
    assert not host.file("/sys/module/amdgpu").exists
