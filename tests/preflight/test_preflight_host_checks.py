"""The preflight filters for real GPU hosts: the running kernel against AMD's list, Secure Boot with the
DKMS driver, GPU agents of another kind (an enabled iGPU, on real rocminfo fixtures), free disk summed
per filesystem, and the HiCache pools against MemAvailable with SGLang 0.5.23's own rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "rocminfo"
pf = load(ROOT / "roles" / "preflight" / "filter_plugins" / "preflight.py")
sc = load("roles/sglang_service/filter_plugins/sglang_service_checks.py", "sglang_service_checks")
disk = load(ROOT / "module_utils" / "fleet_free_disk.py")
DEFAULTS = yaml.safe_load((ROOT / "roles" / "preflight" / "defaults" / "main.yml").read_text())
KERNELS = DEFAULTS["preflight_rocm_supported_kernels"]


def ubuntu(kernel: str) -> dict:
    return {"distribution": "Ubuntu", "distribution_version": "24.04", "distribution_major_version": "24",
            "kernel": kernel}


def settings(**extra) -> dict:
    return {"dkms": True, "rocm_version": "7.1.1", "kernels": KERNELS, "accept_unlisted": False, **extra}


# --- kernel -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", ["6.8.0-85-generic", "6.14.0-33-generic"])
def test_listed_kernels_pass(kernel):
    assert pf.kernel_findings(ubuntu(kernel), settings()) == []


@pytest.mark.parametrize("kernel", ["6.11.0-29-generic", "6.17.0-5-generic", "6.1.0-1-amd64"])
def test_unlisted_kernel_is_refused_naming_the_variables(kernel):
    (finding,) = pf.kernel_findings(ubuntu(kernel), settings())
    assert f"running kernel {kernel} (Ubuntu 24.04) is not one AMD lists for ROCm 7.1.1" in finding
    assert "series 6.8, 6.14" in finding
    assert "rocm_version" in finding
    assert "preflight_kernel_accept_unlisted: true" in finding


def test_debian_12_kernel_and_a_distribution_amd_does_not_list():
    debian = {"distribution": "Debian", "distribution_version": "12.7", "distribution_major_version": "12",
              "kernel": "6.1.0-26-amd64"}
    assert pf.kernel_findings(debian, settings()) == []
    trixie = dict(debian, distribution_version="13.1", distribution_major_version="13", kernel="6.12.48+deb13-amd64")
    (finding,) = pf.kernel_findings(trixie, settings())
    assert "series none for Debian 13" in finding


def test_kernel_check_knobs_and_unknown_releases():
    assert pf.kernel_findings(ubuntu("6.17.0-5-generic"), settings(accept_unlisted=True)) == []
    assert pf.kernel_findings(ubuntu("6.17.0-5-generic"), settings(dkms=False)) == []
    (unknown,) = pf.kernel_findings(ubuntu("6.8.0-85-generic"), settings(rocm_version="9.9.9"))
    assert "no kernel list for ROCm 9.9.9 (rocm_version)" in unknown
    (unset,) = pf.kernel_findings(ubuntu("6.8.0-85-generic"), settings(rocm_version=""))
    assert "set rocm_version (or preflight_rocm_version)" in unset


def test_the_kernel_data_covers_the_releases_the_rocm_role_is_pinned_to():
    rocm = yaml.safe_load((ROOT / "roles" / "rocm" / "defaults" / "main.yml").read_text())
    assert rocm["rocm_version"] in KERNELS
    assert KERNELS["7.1.1"]["Ubuntu 24.04"] == ["6.8", "6.14"]


# --- Secure Boot --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("probe", "state"),
    [("1", "enabled"), ("0", "disabled"), ("SecureBoot enabled", "enabled"), ("SecureBoot disabled", "disabled"),
     ("EFI variables are not supported on this system", "absent"), ("no-efi", "absent"), ("", "absent")],
)
def test_secure_boot_state(probe, state):
    assert pf.secure_boot_state(probe) == state


def test_secure_boot_with_dkms_is_refused_unless_the_key_is_enrolled():
    (finding,) = pf.secure_boot_findings("1", {"dkms": True, "mok_enrolled": False})
    assert "Secure Boot is enabled" in finding
    assert "no /dev/kfd" in finding
    assert "preflight_secure_boot_mok_enrolled: true" in finding
    assert pf.secure_boot_findings("1", {"dkms": True, "mok_enrolled": True}) == []
    assert pf.secure_boot_findings("1", {"dkms": False, "mok_enrolled": False}) == []
    assert pf.secure_boot_findings("no-efi", {"dkms": True, "mok_enrolled": False}) == []
    assert pf.secure_boot_findings("SecureBoot disabled", {"dkms": True, "mok_enrolled": False}) == []


# --- GPU agents of another kind -------------------------------------------------------------------------
def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text()


def test_gpu_agents_in_hip_order_from_real_rocminfo():
    assert [a["name"] for a in pf.gpu_agents(fixture("igpu-first-two-7900xtx"))] == ["gfx1036", "gfx1100", "gfx1100"]
    assert [a["name"] for a in pf.gpu_agents(fixture("two-7900xtx"))] == ["gfx1100", "gfx1100"]
    assert pf.gpu_agents(fixture("two-7900xtx"))[0]["marketing_name"] == "Radeon RX 7900 XTX"
    assert pf.gpu_agents("") == []


def test_enabled_igpu_is_refused_unless_accepted():
    text = fixture("igpu-first-two-7900xtx")
    (finding,) = pf.other_gpu_findings(text, {"gpu_arch": "gfx1100", "accept_other": False})
    assert "HIP device 0: gfx1036 (AMD Radeon Graphics)" in finding
    assert "AMD advises disabling the iGPU in the BIOS" in finding
    assert "preflight_gpu_accept_other_agents: true" in finding
    assert pf.other_gpu_findings(text, {"gpu_arch": "gfx1100", "accept_other": True}) == []
    assert pf.other_gpu_findings(fixture("two-7900xtx"), {"gpu_arch": "gfx1100"}) == []
    assert pf.other_gpu_findings(None, {"gpu_arch": "gfx1100"}) == []


# --- disk, summed per filesystem (module_utils/fleet_free_disk.py; the module's run: tests/test_fleet_free_disk.py)
def need(path: str, gb: float, what: str) -> dict:
    return {"path": path, "need_bytes": gb * 1e9, "what": what, "fix": f"Lower the {what} knob."}


def test_needs_on_one_filesystem_are_summed():
    measured = [
        {"need": need("/opt", 25, "ROCm"), "free": 40_000_000_000, "mount": "/"},
        {"need": need("/opt/sglang", 20, "venv"), "free": 40_000_000_000, "mount": "/"},
        {"need": need("/srv/models", 1, "models"), "free": 900_000_000_000, "mount": "/srv"},
    ]
    (finding,) = disk.findings(measured, "h1")
    assert "the filesystem at / on h1 has 40.0 GB free, but this run stages 45.0 GB there" in finding
    assert "ROCm under /opt: 25.0 GB; venv under /opt/sglang: 20.0 GB" in finding
    assert "Lower the ROCm knob. Lower the venv knob." in finding
    measured[1]["need"] = need("/opt/sglang", 15, "venv")
    assert disk.findings(measured, "h1") == []


def test_one_need_keeps_the_single_path_message_and_zero_needs_are_ignored():
    measured = [
        {"need": need("/srv", 1, "x"), "free": 500_000_000, "mount": "/srv"},
        {"need": need("/opt", 0, "y"), "free": 0, "mount": "/"},
    ]
    assert disk.findings(measured, "h") == ["/srv on h has 0.5 GB free; x needs 1.0 GB. Lower the x knob."]
    assert disk.findings([], "h") == []


# --- MemAvailable with SGLang's rule ------------------------------------------------------------------------
POOLS = [{"label": "main: 2 x 12 GB", "gb": 24, "variable": "sglang_service_hicache_args['--hicache-size']"}]
GIB = 1024**3


def test_pools_need_sglang_reserve_within_mem_available():
    fits = f"MemAvailable {24 * 10**9 + 10 * GIB}\n"
    assert sc.mem_available_findings(POOLS, fits, 10, "h") == []
    short = f"MemAvailable {24 * 10**9 + 10 * GIB - 1}\n"
    (finding,) = sc.mem_available_findings(POOLS, short, 10, "h")
    assert "SGLang would refuse the HiCache host pools on h: they pin 24 GB (main: 2 x 12 GB)" in finding
    assert "MemAvailable minus its own 10 GiB reserve (sglang_service_sglang_reserve_gib)" in finding
    assert "Lower sglang_service_hicache_args['--hicache-size']" in finding


def test_memory_held_by_the_plans_running_unit_counts_as_freed_by_the_restart():
    probe = f"MemAvailable {10 * GIB}\nsglang-main.service {24 * 10**9}\n"
    assert sc.mem_available_findings(POOLS, probe, 10, "h") == []
    (finding,) = sc.mem_available_findings(POOLS, f"MemAvailable {10 * GIB}\nsglang-main.service {10**9}\n", 10, "h")
    assert "held by sglang-main.service (freed by the restart)" in finding


def test_no_pools_or_no_meminfo():
    assert sc.mem_available_findings([{"gb": 0}], "MemAvailable 1\n", 10) == []
    (finding,) = sc.mem_available_findings(POOLS, "", 10, "h")
    assert "MemAvailable could not be read" in finding


def test_the_reserve_is_sglangs_own_constant():
    """The default is read off sglang 0.5.23 (srt/mem_cache/pool_host/base.py): 10 GiB."""
    service = yaml.safe_load((ROOT / "roles" / "sglang_service" / "defaults" / "main.yml").read_text())
    assert service["sglang_service_sglang_reserve_gib"] == 10
