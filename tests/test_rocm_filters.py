"""The rocm role's release filters as plain functions: parsing package specs, the release id,
reading dpkg-query and apt-cache madison output, and what an activation changes or cannot do."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jinja2
import pytest
import yaml
from jinja_old import expr
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
    "  rocminfo |    5.2.3-2 | http://apt.mirror.example/debian bookworm/main amd64 Packages\n"
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


# --- AMD's repository layout per ROCm release (vars/main.yml _rocm_amd_releases) ---------------------

def role_data():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    releases = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_rocm_amd_releases"]
    return defaults, releases


def render_repositories(rocm_version, **overrides):
    """rocm_amd_repositories as the role's defaults render them (plain Jinja, the role's own templates)."""
    defaults, releases = role_data()
    # Renders URLs, not HTML: no autoescape.
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)  # noqa: S701
    ctx = {"_rocm_amd_releases": releases, "rocm_version": rocm_version,
           "rocm_amd_repo_base_url": defaults["rocm_amd_repo_base_url"]}
    for name in ("rocm_amdgpu_version", "rocm_amd_graphics_version"):
        ctx[name] = overrides.get(name, env.from_string(defaults[name]).render(ctx))
    return ctx, [env.from_string(repo["uris"]).render(ctx) for repo in defaults["rocm_amd_repositories"]]


def test_the_role_knows_the_layout_of_7_1_1_and_7_2_1():
    _, releases = role_data()
    assert releases == {"7.1.1": {"amdgpu": "30.20.1", "graphics": "7.1.1"},
                        "7.2.1": {"amdgpu": "30.30.1", "graphics": "7.2.1"}}


def test_7_2_1_renders_its_three_repositories():
    ctx, uris = render_repositories("7.2.1")
    assert ctx["rocm_amdgpu_version"] == "30.30.1"
    assert uris == ["https://repo.radeon.com/rocm/apt/7.2.1",
                    "https://repo.radeon.com/graphics/7.2.1/ubuntu",
                    "https://repo.radeon.com/amdgpu/30.30.1/ubuntu"]


def test_the_default_release_renders_as_before():
    # The role's default rocm_version keeps its URLs (and so its release id).
    defaults, _ = role_data()
    assert defaults["rocm_version"] == "7.1.1"
    _, uris = render_repositories(defaults["rocm_version"])
    assert uris == ["https://repo.radeon.com/rocm/apt/7.1.1",
                    "https://repo.radeon.com/graphics/7.1.1/ubuntu",
                    "https://repo.radeon.com/amdgpu/30.20.1/ubuntu"]


def test_an_unknown_release_renders_no_guess_and_is_refused(f):
    _, releases = role_data()
    ctx, _ = render_repositories("7.2.2")
    assert ctx["rocm_amdgpu_version"] == ""
    assert ctx["rocm_amd_graphics_version"] == ""
    problem = f.rocm_amd_layout_error("7.2.2", releases, ctx["rocm_amdgpu_version"], ctx["rocm_amd_graphics_version"])
    assert problem.startswith("rocm_version '7.2.2': the rocm role does not know AMD's repository layout")
    assert "it knows 7.1.1, 7.2.1" in problem
    assert "set rocm_amdgpu_version and rocm_amd_graphics_version" in problem
    with pytest.raises(f.AnsibleFilterError, match=re.escape("rocm_version '7.2.2'")):
        f.rocm_amd_layout("7.2.2", releases, "", "")
    # Only one of the two given: the refusal names the one still missing.
    assert "set rocm_amd_graphics_version to" in f.rocm_amd_layout_error("7.2.2", releases, "30.30.2", "")


def test_explicit_values_win_and_complete_an_unknown_release(f):
    _, releases = role_data()
    assert f.rocm_amd_layout("7.2.1", releases, "30.30.1", "7.2.1") == {"amdgpu": "30.30.1", "graphics": "7.2.1"}
    assert f.rocm_amd_layout("7.2.2", releases, "30.30.2", "7.2.2-x") == {"amdgpu": "30.30.2", "graphics": "7.2.2-x"}
    assert f.rocm_amd_layout_error("7.2.2", releases, "30.30.2", "7.2.2-x") == ""
    _, uris = render_repositories("7.2.2", rocm_amdgpu_version="30.30.2", rocm_amd_graphics_version="7.2.2-x")
    assert uris[1:] == ["https://repo.radeon.com/graphics/7.2.2-x/ubuntu", "https://repo.radeon.com/amdgpu/30.30.2/ubuntu"]


# --- The amdgpu driver: loaded against installed (tasks/reboot_state.yml's probe) ---------------------

def probe(loaded=True, loaded_version="", loaded_src="", modinfo=True, disk_file="", disk_version="",
          disk_src="", dkms=None, kernel="6.8.0-48-generic"):
    """What the probe in tasks/reboot_state.yml prints."""
    lines = [f"loaded={'yes' if loaded else 'no'}", f"loaded_version={loaded_version}",
             f"loaded_srcversion={loaded_src}", f"kernel={kernel}"]
    if modinfo:
        lines += ["modinfo=yes", f"disk_file={disk_file}", f"disk_version={disk_version}",
                  f"disk_srcversion={disk_src}"]
    else:
        lines.append("modinfo=no")
    if dkms is not None:
        lines += ["dkms_status:", *dkms]
    return "\n".join(lines) + "\n"


DKMS_FILE = "/lib/modules/6.8.0-48-generic/updates/dkms/amdgpu.ko.zst"
INTREE_FILE = "/lib/modules/6.8.0-48-generic/kernel/drivers/gpu/drm/amd/amdgpu/amdgpu.ko.zst"
DKMS3 = ["amdgpu/6.12.12-2194681.24.04, 6.8.0-48-generic, x86_64: installed"]


def test_no_module_loaded_says_so_plainly(f):
    # The test hosts (a container on a kernel without amdgpu, no modinfo in the guest).
    state = f.rocm_amdgpu_state(probe(loaded=False, modinfo=False))
    assert state["loaded"] is False
    assert state["pending"] is False
    assert state["loaded_version"] is None
    assert state["installed_version"] is None
    assert state["summary"].startswith("the amdgpu driver is not loaded on this host (no /sys/module/amdgpu)")
    assert "modinfo is not installed" in state["summary"]
    # Installed but not loaded (a blacklisted driver, or no card): reported, not a pending reboot.
    state = f.rocm_amdgpu_state(probe(loaded=False, disk_file=DKMS_FILE, disk_version="6.12.12", dkms=DKMS3))
    assert state["pending"] is False
    assert f"the module installed for kernel 6.8.0-48-generic is 6.12.12 ({DKMS_FILE})" in state["summary"]


def test_the_in_tree_driver_still_loaded_after_amdgpu_dkms_installed_waits_for_a_reboot(f):
    state = f.rocm_amdgpu_state(probe(loaded_version="", disk_file=DKMS_FILE, disk_version="6.12.12", dkms=DKMS3))
    assert state["pending"] is True
    assert state["summary"].startswith(
        f"the loaded amdgpu driver is in-tree, no version but 6.12.12 ({DKMS_FILE}) is installed for kernel "
        "6.8.0-48-generic: the new driver waits for a reboot")
    assert "dkms status: 6.12.12-2194681.24.04 for 6.8.0-48-generic (installed)" in state["summary"]


def test_an_older_dkms_driver_loaded_waits_for_a_reboot(f):
    state = f.rocm_amdgpu_state(probe(loaded_version="6.10.5", disk_file=DKMS_FILE, disk_version="6.12.12"))
    assert state["pending"] is True
    assert (state["loaded_version"], state["installed_version"]) == ("6.10.5", "6.12.12")


def test_the_same_driver_loaded_and_installed_is_not_pending(f):
    state = f.rocm_amdgpu_state(probe(loaded_version="6.12.12", loaded_src="ABC", disk_file=DKMS_FILE,
                                      disk_version="6.12.12", disk_src="ABC", dkms=DKMS3))
    assert state["pending"] is False
    assert state["summary"].startswith(f"the loaded amdgpu driver is the installed one: 6.12.12 ({DKMS_FILE})")
    # The distribution's kernel driver on both sides (no amdgpu-dkms): nothing to wait for.
    state = f.rocm_amdgpu_state(probe(disk_file=INTREE_FILE))
    assert state["pending"] is False
    assert "in-tree, no version" in state["summary"]


def test_same_version_other_build_waits_for_a_reboot(f):
    state = f.rocm_amdgpu_state(probe(loaded_version="6.12.12", loaded_src="ABC", disk_file=DKMS_FILE,
                                      disk_version="6.12.12", disk_src="DEF"))
    assert state["pending"] is True
    assert "srcversion ABC" in state["summary"]
    assert "srcversion DEF" in state["summary"]


def test_loaded_but_installed_unknown_is_reported_not_pending(f):
    state = f.rocm_amdgpu_state(probe(loaded_version="6.12.12", modinfo=False))
    assert state["pending"] is False
    assert state["summary"] == ("the loaded amdgpu driver is 6.12.12; the installed one is unknown "
                                "(modinfo is not installed)")
    state = f.rocm_amdgpu_state(probe(loaded_version="6.12.12"))
    assert "modinfo finds no amdgpu module for kernel 6.8.0-48-generic" in state["summary"]


def test_dkms_status_both_formats(f):
    lines = ["amdgpu/6.12.12-2194681.24.04, 6.8.0-48-generic, x86_64: installed",
             "amdgpu, 6.10.5-2084815.24.04, 6.8.0-45-generic, x86_64: installed (original_module exists)",
             "amdgpu/6.12.12-2194681.24.04: added", "nvidia/550.1, 6.8.0-48-generic, x86_64: installed", "garbage"]
    state = f.rocm_amdgpu_state(probe(loaded=False, dkms=lines))
    assert state["dkms"] == [
        {"version": "6.12.12-2194681.24.04", "kernel": "6.8.0-48-generic", "arch": "x86_64", "state": "installed"},
        {"version": "6.10.5-2084815.24.04", "kernel": "6.8.0-45-generic", "arch": "x86_64",
         "state": "installed (original_module exists)"},
        {"version": "6.12.12-2194681.24.04", "kernel": "", "arch": "", "state": "added"},
    ]


# --- Staged package files (tasks/fetch.yml records them, tasks/install.yml removes them) -------------

# What `apt-get install --print-uris` printed on Debian 12 for librocm-smi-dev (the rocm scenario's change).
PRINT_URIS = (
    "'http://apt.mirror.example/debian/pool/main/r/rocm-smi-lib/librocm-smi64-1_5.2.3-2_amd64.deb' "
    "librocm-smi64-1_5.2.3-2_amd64.deb 459208 MD5Sum:3421382fb4198dbb2bf5b32a4892bf9b\n"
    "'http://apt.mirror.example/debian/pool/main/r/rocm-smi-lib/librocm-smi-dev_5.2.3-2_amd64.deb' "
    "librocm-smi-dev_5.2.3-2_amd64.deb 570392 MD5Sum:24f2d190fae8c3c002bd2f917a2e9664\n"
    "'https://repo.radeon.com/amdgpu/30.30.1/ubuntu/pool/main/a/amdgpu-dkms/amdgpu-dkms_1%3a6.12.12_all.deb' "
    "amdgpu-dkms_1%3a6.12.12_all.deb 1000 SHA256:00\n"
)


def test_staged_files_from_print_uris(f):
    assert f.rocm_staged_files(PRINT_URIS) == ["librocm-smi64-1_5.2.3-2_amd64.deb", "librocm-smi-dev_5.2.3-2_amd64.deb",
                                               "amdgpu-dkms_1%3a6.12.12_all.deb"]
    assert f.rocm_staged_files("") == []
    with pytest.raises(f.AnsibleFilterError, match=re.escape("'../../etc/passwd', which is not a .deb file name")):
        f.rocm_staged_files("'http://x/y.deb' ../../etc/passwd 1 MD5Sum:0\n")


def test_staged_record_accumulates_and_a_rerun_keeps_it(f):
    first = f.rocm_staged_record({}, "aaaaaaaaaaaa", ["b.deb", "a.deb"])
    assert first == {"release_id": "aaaaaaaaaaaa", "files": ["a.deb", "b.deb"]}
    # A re-run downloads nothing new: the same record (idempotent).
    assert f.rocm_staged_record(first, "aaaaaaaaaaaa", []) == first
    # A newer release staged before the older one was activated: both sets stay listed.
    assert f.rocm_staged_record(first, "bbbbbbbbbbbb", ["c.deb"]) == {"release_id": "bbbbbbbbbbbb",
                                                                        "files": ["a.deb", "b.deb", "c.deb"]}
    assert f.rocm_staged_record({}, "aaaaaaaaaaaa", []) == {}


def test_staged_files_go_only_after_their_release_is_active(f):
    record = {"release_id": "aaaaaaaaaaaa", "files": ["a.deb", "../x"]}
    assert f.rocm_staged_to_remove(record, "aaaaaaaaaaaa", True) == ["a.deb"]
    # The activation left something to install (failed, or a rollback's notes): they stay.
    assert f.rocm_staged_to_remove(record, "aaaaaaaaaaaa", False) == []
    # Another release was activated (a rollback to the previous one): they stay for the staged one.
    assert f.rocm_staged_to_remove(record, "cccccccccccc", True) == []
    assert f.rocm_staged_to_remove({}, "aaaaaaaaaaaa", True) == []


# --- the filters that replaced inline ternaries (gpu_check.yml, install.yml, main.yml) -------------

OLD_SAID = (
    "(r is skipped) | ternary('is not installed (' ~ cmd ~ ' is neither on PATH nor in /opt/rocm/bin)',"
    " (r.rc | default(1) == 0) | ternary('rc=0',"
    " 'failed (rc=' ~ (r.rc | default('n/a')) ~ '): \"' ~ last ~ '\"'))"
)
OLD_HINT = ("(r.rc | default(0) == 0) | ternary('',"
            " 'That is the error rocminfo itself prints when no GPU (or no amdgpu kernel driver) is present.')")
RESULTS = [
    {"skipped": True, "skip_reason": "Conditional result was False"},
    {"rc": 0, "stdout": "Agent 1", "stderr": ""},
    {"rc": 1, "stdout": "", "stderr": "hsa api call failure at: ...\nCall returned HSA_STATUS_ERROR_OUT_OF_RESOURCES"},
    {"failed": True, "msg": "[Errno 2] No such file or directory"},
]


@pytest.mark.parametrize("result", RESULTS)
def test_rocminfo_said_and_hint(f, result):
    last = "Call returned HSA_STATUS_ERROR_OUT_OF_RESOURCES"
    assert f.rocm_rocminfo_said(result, "rocminfo", last) == expr(OLD_SAID, r=result, cmd="rocminfo", last=last)
    assert f.rocm_rocminfo_hint(result) == expr(OLD_HINT, r=result)


@pytest.mark.parametrize("slurped", [
    {"content": "eyJpZCI6ICJhYmMiLCAicmVsZWFzZSI6IHsicGFja2FnZXMiOiB7InJvY20iOiBudWxsfX19", "encoding": "base64"},
    {"failed": True, "msg": "file not found: /var/lib/hicache-fleet/rocm-release.json"},
])
def test_recorded(f, slurped):
    old = expr("(r.content | b64decode | from_json) if r.content is defined else {}", r=slurped)
    assert f.rocm_recorded(slurped) == old


@pytest.mark.parametrize(("pending", "plan"), [(True, ["install rocm 7.1.1", "reboot"]), (True, []), (False, ["x"])])
def test_stage_note(f, pending, plan):
    old = expr("pending | ternary('and its activation is pending (' ~ (plan | join('; ')) ~ ')',"
               " 'and nothing is pending')", pending=pending, plan=plan)
    assert f.rocm_stage_note(pending, plan) == old


def test_a_mirrors_credentials_go_to_apt_auth_not_into_the_release(f):
    """Issue 24: the release (a cacheable fact, rocm-release.json 0644) holds the URI without
    user:password; apt gets them from auth.conf.d (0600)."""
    repos = [{"name": "rocm", "uris": "https://bob:pw-Rocm-1@127.0.0.4:9/radeon/rocm/apt/7.2.1"},
             {"name": "amdgpu", "uris": "https://bob:pw-Rocm-1@127.0.0.4:9/radeon/amdgpu/30.30.1/ubuntu/"},
             {"name": "open", "uris": "https://repo.radeon.com/graphics/7.2.1/ubuntu"}]
    release = f.rocm_repositories(repos, "noble")
    assert [r["uris"] for r in release] == ["https://127.0.0.4:9/radeon/rocm/apt/7.2.1",
                                            "https://127.0.0.4:9/radeon/amdgpu/30.30.1/ubuntu/",
                                            "https://repo.radeon.com/graphics/7.2.1/ubuntu"]
    assert "pw-Rocm-1" not in json.dumps(release)
    assert f.rocm_apt_auth(repos) == (
        "machine 127.0.0.4:9/radeon/rocm/apt/7.2.1 login bob password pw-Rocm-1\n"
        "machine 127.0.0.4:9/radeon/amdgpu/30.30.1/ubuntu login bob password pw-Rocm-1\n")
    assert f.rocm_apt_auth(repos[2:]) == ""
