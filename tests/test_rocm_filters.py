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


# --- GPU mapping on real rocminfo outputs (tests/fixtures/rocminfo/README.md says where each is from) ---

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "rocminfo"
MAIN = {"name": "main", "port": 30004, "environment": {"HIP_VISIBLE_DEVICES": "0,1"}}


def rocminfo(name):
    return (FIXTURES / f"{name}.txt").read_text()


def test_agents_count_gpus_only_in_rocminfo_order(f):
    agents = f.rocm_agents(rocminfo("igpu-first-two-7900xtx"))
    assert [a["agent"] for a in agents] == [1, 2, 3, 4]
    assert [a["device_type"] for a in agents] == ["CPU", "GPU", "GPU", "GPU"]
    gpus = [a for a in agents if a["device_type"] == "GPU"]
    # HIP indices count GPU agents only: Agent 2 (the iGPU) is HIP device 0, never "device 2".
    assert [(g["hip_index"], g["name"], g["bdf"]) for g in gpus] == [
        (0, "gfx1036", "11:00.0"), (1, "gfx1100", "03:00.0"), (2, "gfx1100", "09:00.0")]
    # The ISA block's nested "Name: amdgcn-amd-amdhsa--gfx1100" is not taken for the agent's name.
    assert gpus[2]["uuid"] == "GPU-398a3f843a146602"
    assert gpus[2]["marketing_name"] == "Radeon RX 7900 XTX"
    assert "hip_index" not in agents[0]


def test_agents_of_no_output(f):
    assert f.rocm_agents("") == []
    # What rocminfo prints on a host without the amdgpu driver (the test hosts): no agents.
    assert f.rocm_agents("ROCk module is NOT loaded, possibly no GPU devices\n") == []


def test_two_7900xtx_map_cleanly(f):
    m = f.rocm_gpu_map(rocminfo("two-7900xtx"), [MAIN], "gfx1100", 2)
    assert m["problems"] == []
    assert m["mapping"] == {"main": [0, 1]}
    (inst,) = m["instances"]
    assert inst["tp_size"] == 2
    assert [(d["hip_index"], d["name"], d["bdf"]) for d in inst["devices"]] == [
        (0, "gfx1100", "03:00.0"), (1, "gfx1100", "09:00.0")]


def test_unset_mask_sees_every_gpu(f):
    main = {"name": "main", "port": 30004}
    assert f.rocm_gpu_map(rocminfo("two-7900xtx"), [main], "gfx1100", 2)["problems"] == []
    problems = f.rocm_gpu_map(rocminfo("igpu-first-two-7900xtx"), [main], "gfx1100", 2)["problems"]
    assert any("unset (every GPU agent is visible) makes HIP device 0 = gfx1036" in p for p in problems), problems


def test_igpu_at_index_0_is_refused_with_the_right_indices(f):
    problems = f.rocm_gpu_map(rocminfo("igpu-first-two-7900xtx"), [MAIN], "gfx1100", 2)["problems"]
    assert len(problems) == 2, problems
    assert problems[0].startswith('instance main: HIP_VISIBLE_DEVICES "0,1" makes HIP device 0 = gfx1036 '
                                  "(AMD Radeon Graphics, PCI 11:00.0) visible, which is not a gfx1100")
    assert "TP size 2 needs 2 visible gfx1100 device(s)" in problems[1]
    assert all('set HIP_VISIBLE_DEVICES: "1,2"' in p for p in problems)
    # The suggested value passes.
    fixed = {**MAIN, "environment": {"HIP_VISIBLE_DEVICES": "1,2"}}
    assert f.rocm_gpu_map(rocminfo("igpu-first-two-7900xtx"), [fixed], "gfx1100", 2)["problems"] == []


def test_missing_card_is_refused(f):
    problems = f.rocm_gpu_map(rocminfo("one-7900xtx-missing"), [MAIN], "gfx1100", 2)["problems"]
    assert any("names HIP device 1, which does not exist: rocminfo lists 1 GPU agent(s)" in p for p in problems)
    assert any("TP size 2 needs 2 visible gfx1100 device(s)" in p and "makes 1 visible" in p for p in problems)
    assert all("check the cards and the amdgpu driver" in p for p in problems)


def test_tp_size_must_match_the_visible_cards(f):
    out = rocminfo("two-7900xtx")
    one = {"name": "main", "environment": {"HIP_VISIBLE_DEVICES": "1"}}
    assert "TP size 2 needs 2" in f.rocm_gpu_map(out, [one], "gfx1100", 2)["problems"][0]
    # An instance's own --tp-size wins over the default.
    assert f.rocm_gpu_map(out, [{**one, "args": {"--tp-size": 1}}], "gfx1100", 2)["problems"] == []
    assert "TP size 1 needs 1" in f.rocm_gpu_map(out, [{**MAIN, "tp_size": 1}], "gfx1100", 2)["problems"][0]
    assert "not a whole number" in f.rocm_gpu_map(out, [MAIN], "gfx1100", "two")["problems"][0]


def test_masks_by_uuid_duplicates_garbage_and_sharing(f):
    out = rocminfo("two-7900xtx")
    by_uuid = {"name": "a", "environment": {"HIP_VISIBLE_DEVICES": "GPU-398a3f843a146602"}}
    m = f.rocm_gpu_map(out, [by_uuid], "gfx1100", 1)
    assert m["problems"] == []
    assert m["instances"][0]["devices"][0]["hip_index"] == 1
    twice = {"name": "a", "environment": {"HIP_VISIBLE_DEVICES": "0,0"}}
    assert "names HIP device 0 twice" in f.rocm_gpu_map(out, [twice], "gfx1100", 2)["problems"][0]
    garbage = {"name": "a", "environment": {"HIP_VISIBLE_DEVICES": "0,x"}}
    assert "'x' is neither a HIP device index" in f.rocm_gpu_map(out, [garbage], "gfx1100", 2)["problems"][0]
    empty = {"name": "a", "environment": {"HIP_VISIBLE_DEVICES": ""}}
    assert "is empty, which hides every GPU" in f.rocm_gpu_map(out, [empty], "gfx1100", 2)["problems"][0]
    rocr = {"name": "a", "environment": {"HIP_VISIBLE_DEVICES": "0,1", "ROCR_VISIBLE_DEVICES": "1"}}
    assert "ROCR_VISIBLE_DEVICES is set" in f.rocm_gpu_map(out, [rocr], "gfx1100", 2)["problems"][0]
    a = {"name": "a", "environment": {"HIP_VISIBLE_DEVICES": "0"}}
    b = {"name": "b", "environment": {"HIP_VISIBLE_DEVICES": "0"}}
    assert f.rocm_gpu_map(out, [a, b], "gfx1100", 1)["problems"] == [
        "instances a, b all use HIP device 0 = gfx1100 (Radeon RX 7900 XTX, PCI 03:00.0): give each instance "
        "its own GPUs (HIP_VISIBLE_DEVICES in sglang_service_instances)"]
    # A mask from the shared environment applies to every instance unless the instance sets its own.
    assert f.rocm_gpu_map(out, [{"name": "a"}], "gfx1100", 1, {"HIP_VISIBLE_DEVICES": "1"})["problems"] == []


def test_no_instances_no_mapping(f):
    m = f.rocm_gpu_map(rocminfo("one-7900xtx-missing"), [], "gfx1100", 2)
    assert m["problems"] == []
    assert m["instances"] == []
    assert len(m["gpus"]) == 1
