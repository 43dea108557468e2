"""The unit for real GPUs, rendered by Ansible through the role's plan phase (as test_render.py does).

- a TP=2 instance bound to a loopback address carries NCCL_SOCKET_IFNAME=lo and GLOO_SOCKET_IFNAME=lo
  (RCCL and gloo would otherwise bootstrap on the first non-loopback interface, which the unit's
  IPAddressAllow=localhost drops); a TP=1 instance and a non-loopback one do not;
- every unit is ordered After= and Wants= modprobe@amdgpu.service and carries HF_HUB_OFFLINE=1;
  emptying sglang_service_driver_units / sglang_service_hf_hub_offline: false removes those lines;
- the rendered unit passes `systemd-analyze verify` with no complaint about its own lines.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from plugins import load
from service_render import run_plans

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "sglang_service"


INSTANCES = [
    # seed-validated: --tp-size 2, bound to sglang_service_bind_address (127.0.0.1).
    {"name": "tp2", "port": 30004},
    {"name": "tp2six", "port": 30005, "bind_address": "::1"},
    {"name": "tp1", "port": 30006, "args": {"--tp-size": 1}},
    # Rendering only: 192.0.2.0/24 is the documentation range, nothing is sent to it.
    {"name": "public", "port": 30007, "bind_address": "192.0.2.10", "api_key": "k" * 16},
    {"name": "pp2", "port": 30008, "args": {"--tp-size": 1, "--pp-size": 2}},
]


OFF_VARS = {
    "sglang_service_driver_units": [],
    "sglang_service_hf_hub_offline": False,
    "sglang_service_rank_interface": "",
}


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> dict[str, Path]:
    """Both plans in one Ansible run: `defaults` (the role's knobs) and `off` (the knobs emptied)."""
    cases = {"defaults": (tmp_path_factory.mktemp("gpu-defaults"), {"sglang_service_instances": INSTANCES}),
             "off": (tmp_path_factory.mktemp("gpu-off"), {"sglang_service_instances": INSTANCES, **OFF_VARS})}
    run_plans(tmp_path_factory.mktemp("gpu-run"), cases)
    return {name: out for name, (out, _) in cases.items()}


@pytest.fixture(scope="module")
def rendered(renders) -> Path:
    return renders["defaults"]


@pytest.fixture(scope="module")
def rendered_off(renders) -> Path:
    return renders["off"]


def unit_lines(directory: Path, name: str) -> list[str]:
    return (directory / f"sglang-{name}.service").read_text(encoding="utf-8").splitlines()


def section(lines: list[str], name: str) -> list[str]:
    start = lines.index(f"[{name}]")
    rest = lines[start + 1 :]
    end = next((i for i, line in enumerate(rest) if line.startswith("[")), len(rest))
    return rest[:end]


IFNAME_LINES = ["Environment=GLOO_SOCKET_IFNAME=lo", "Environment=NCCL_SOCKET_IFNAME=lo"]


@pytest.mark.parametrize("name", ["tp2", "tp2six", "pp2"])
def test_multi_rank_loopback_instance_bootstraps_on_lo(rendered, name):
    service = section(unit_lines(rendered, name), "Service")
    assert [line for line in service if "SOCKET_IFNAME" in line] == IFNAME_LINES
    # Before the EnvironmentFile, so an instance's `environment` can override them.
    assert service.index(IFNAME_LINES[0]) < service.index(f"EnvironmentFile=/etc/sglang/{name}.env")
    assert "IPAddressAllow=localhost" in service


@pytest.mark.parametrize("name", ["tp1", "public"])
def test_single_rank_or_non_loopback_instance_gets_no_interface_settings(rendered, name):
    lines = unit_lines(rendered, name)
    assert [line for line in lines if "SOCKET_IFNAME" in line] == []


def test_public_instance_is_tp2_and_firewalled_to_its_network(rendered):
    # The non-loopback case above is TP=2 (not skipped for being TP=1).
    text = "\n".join(unit_lines(rendered, "public"))
    assert "--tp-size 2" in text
    assert "\nIPAddressAllow=localhost 192.0.2.0/24\n" in text


@pytest.mark.parametrize("name", [item["name"] for item in INSTANCES])
def test_every_unit_waits_for_the_amdgpu_module_and_stays_offline(rendered, name):
    lines = unit_lines(rendered, name)
    unit = section(lines, "Unit")
    assert "After=modprobe@amdgpu.service" in unit
    assert "Wants=modprobe@amdgpu.service" in unit
    assert "After=network-online.target" in unit
    assert "Environment=HF_HUB_OFFLINE=1" in section(lines, "Service")


def test_the_knobs_remove_driver_offline_and_interface_lines(rendered_off):
    lines = unit_lines(rendered_off, "tp2")
    assert not [line for line in lines if "modprobe@" in line]
    assert "Environment=HF_HUB_OFFLINE=1" not in lines
    assert not [line for line in lines if "SOCKET_IFNAME" in line]
    assert "After=network-online.target" in section(lines, "Unit")


def test_rendered_tp2_unit_passes_systemd_analyze_verify(rendered, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # verify checks that ExecStart's binary exists: point it at this python, keep every other line.
    lines = [
        f"ExecStart={sys.executable} -c pass" if line.startswith("ExecStart=") else line
        for line in unit_lines(rendered, "tp2")
    ]
    joined = "\n".join(lines)
    # Continuation lines of the old ExecStart belong to it: drop them.
    text = []
    skipping = False
    for line in joined.splitlines():
        if line.startswith("ExecStart="):
            text.append(line)
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        text.append(line)
    unit = tmp_path / "sglang-tp2.service"
    unit.write_text("\n".join(text) + "\n", encoding="utf-8")
    run = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    ours = [line for line in run.stderr.splitlines() if "sglang-tp2.service" in line]
    assert run.returncode == 0, run.stderr
    assert ours == [], run.stderr


# --- the filter as a plain function -------------------------------------------------------------------
def test_rank_interface_env_filter():
    env = load(ROLE / "filter_plugins" / "sglang_service.py").rank_interface_env
    expected = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert env({"--tp-size": 2}, "127.0.0.1", "lo") == expected
    assert env({"--tp-size": "2"}, "127.0.10.1", "lo") == expected
    assert env({"--tensor-parallel-size": 4}, "localhost", "lo") == expected
    assert env({"--tp-size": 2}, "[::1]", "lo") == expected
    assert env({"--tp-size": 1}, "127.0.0.1", "lo") == {}
    assert env({}, "127.0.0.1", "lo") == {}
    assert env({"--tp-size": 2}, "0.0.0.0", "lo") == {}  # noqa: S104 (a bind address as data)
    assert env({"--tp-size": 2}, "10.1.2.3", "lo") == {}
    assert env({"--tp-size": 2}, "127.0.0.1", "") == {}
