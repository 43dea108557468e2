"""The rocm role's release filters as plain functions: parsing package specs, the release id,
reading dpkg-query and apt-cache madison output, and what an activation changes or cannot do."""

from __future__ import annotations

from pathlib import Path

import pytest
from plugins import load

ROLE = Path(__file__).resolve().parents[1] / "roles" / "rocm"


@pytest.fixture(scope="module")
def f():
    return load(ROLE / "filter_plugins" / "rocm.py")


def test_package_specs(f):
    assert f.rocm_package_specs(["rocminfo", "rocm-smi=5.2.3-2"]) == {"rocminfo": None, "rocm-smi": "5.2.3-2"}
    with pytest.raises(f.AnsibleFilterError, match="rocm_distro_packages: 'rocminfo=' is not"):
        f.rocm_package_specs(["rocminfo="])
    with pytest.raises(f.AnsibleFilterError, match="rocminfo is listed twice"):
        f.rocm_package_specs(["rocminfo", "rocminfo=1"])


def test_release_id_is_stable_and_changes_with_the_release(f):
    a = {"source": "distro", "packages": {"rocminfo": None, "rocm-smi": None}}
    b = {"packages": {"rocm-smi": None, "rocminfo": None}, "source": "distro"}
    assert f.rocm_release_id(a) == f.rocm_release_id(b)
    assert len(f.rocm_release_id(a)) == 12
    assert f.rocm_release_id(a) != f.rocm_release_id({**a, "packages": {**a["packages"], "hipcc": None}})


DPKG = "rocminfo\tii \t5.2.3-2\nrocm-smi\trc \t5.2.3-1\nlibfoo:amd64\tii \t1.0\n"
MADISON = (
    "      rocm | 7.1.1.70101-38~24.04 | https://repo.radeon.com/rocm/apt/7.1.1 noble/main amd64 Packages\n"
    "      rocm | 7.0.2.70002-56~24.04 | https://repo.radeon.com/rocm/apt/7.0.2 noble/main amd64 Packages\n"
    "  rocminfo |    5.2.3-2 | http://deb.debian.org/debian bookworm/main amd64 Packages\n"
)


def test_installed_and_offered(f):
    assert f.rocm_installed(DPKG) == {"rocminfo": "5.2.3-2", "libfoo": "1.0"}
    assert f.rocm_offered(MADISON)["rocm"] == ["7.1.1.70101-38~24.04", "7.0.2.70002-56~24.04"]
    # amd: only the release's own repository counts (7.1.1 is not 7.1.10 either).
    only = f.rocm_offered(MADISON, ["https://repo.radeon.com/rocm/apt/7.0.2"])
    assert only == {"rocm": ["7.0.2.70002-56~24.04"]}
    assert f.rocm_offered(MADISON, ["https://repo.radeon.com/rocm/apt/7.1"]) == {}


def test_amd_wants_the_repository_version_and_plans_a_downgrade(f):
    release = {"source": "amd", "packages": {"rocm": None}}
    offered = f.rocm_offered(MADISON, ["https://repo.radeon.com/rocm/apt/7.0.2"])
    wanted = f.rocm_wanted(release, offered)
    assert wanted == {"rocm": "7.0.2.70002-56~24.04"}
    installed = {"rocm": "7.1.1.70101-38~24.04"}
    assert f.rocm_activation_plan(wanted, installed) == ["rocm: 7.1.1.70101-38~24.04 -> 7.0.2.70002-56~24.04"]
    assert f.rocm_apt_names(f.rocm_changes(wanted, installed)) == ["rocm=7.0.2.70002-56~24.04"]


def test_distro_keeps_installed_unpinned_packages(f):
    release = {"source": "distro", "packages": {"rocminfo": None, "librocm-smi-dev": None, "rocm-smi": "5.2.3-2"}}
    wanted = f.rocm_wanted(release, {})
    installed = {"rocminfo": "5.2.3-1", "rocm-smi": "5.2.3-2"}
    assert f.rocm_changes(wanted, installed) == {"librocm-smi-dev": None}
    assert f.rocm_activation_plan(wanted, installed) == ["librocm-smi-dev: install the archive version"]
    assert f.rocm_activation_plan(wanted, {**installed, "librocm-smi-dev": "5.2.3-2"}) == []


def test_unavailable_versions_are_named(f):
    wanted = {"rocminfo": "5.2.3-1", "rocm-smi": None, "hipcc": None, "rocm-cmake": "5.2.0-1"}
    installed = {"rocminfo": "5.2.3-2", "rocm-smi": "5.2.3-2"}
    offered = {"rocminfo": ["5.2.3-2"], "rocm-cmake": ["5.2.0-1"]}
    missing = f.rocm_unavailable(wanted, installed, offered)
    assert missing == ["hipcc", "rocminfo"]
    assert f.rocm_unavailable_notes(missing, wanted, installed, offered) == [
        "hipcc: apt cannot install it (versions offered: none); it stays uninstalled",
        "rocminfo=5.2.3-1: apt cannot install it (versions offered: 5.2.3-2); 5.2.3-2 stays installed",
    ]
    assert f.rocm_apt_names(f.rocm_changes(wanted, installed), skip=missing) == ["rocm-cmake=5.2.0-1"]


def test_repositories_are_filled_in(f):
    repos = [{"name": "rocm", "uris": "https://r/rocm/apt/7.1.1"}, {"name": "x", "uris": "u", "suites": "jammy",
                                                                   "components": ["main", "extra"]}]
    assert f.rocm_repositories(repos, "noble") == [
        {"name": "rocm", "uris": "https://r/rocm/apt/7.1.1", "suites": "noble", "components": ["main"]},
        {"name": "x", "uris": "u", "suites": "jammy", "components": ["main", "extra"]},
    ]
