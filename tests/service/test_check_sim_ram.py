"""On a simulator host the RAM rules check the RAM the simulator was told (SGLANG_SIM_HOST_MEM_GB), which
stands for the machine's there: a sizing measured for a 256 GB host class passes preflight on a test host
told 256 GB and is refused, naming the figures, on one told 48 GB (whatever this machine has). Real
Ansible on localhost: sglang_service's entry point check, failing with its findings."""

from __future__ import annotations

from pathlib import Path

import pytest
from service_render import FAIL_WITH_FINDINGS, run_check


def _run(tmp_path: Path, told_gb: str):
    return run_check(tmp_path, {
        "sglang_service_module": "sglang_sim.launch_server",
        "sglang_service_platform": "none",
        "sglang_service_hicache_args": {"--enable-hierarchical-cache": True, "--hicache-size": 96},
        "sglang_service_environment": {"SGLANG_SIM_HOST_MEM_GB": told_gb},
        "sglang_service_memory_reserve_gb": 16,
        "sglang_service_instances": [{"name": "main", "port": 30988}],
    }, FAIL_WITH_FINDINGS)


@pytest.mark.parametrize(("told_gb", "passes"), [("256", True), ("48", False)])
def test_the_ram_rule_reads_the_simulators_ram(tmp_path, told_gb, passes):
    run = _run(tmp_path, told_gb)
    out = run.stdout + run.stderr
    if passes:
        assert run.returncode == 0, out[-4000:]
        assert "not enough RAM" not in out
    else:
        assert run.returncode != 0, out[-4000:]
        # 2 ranks x 96 GB + the 16 GB reserve against the 48 GB the simulator was told.
        assert "not enough RAM for the HiCache host pools: they need 192 GB" in out, out[-4000:]
        assert "has 48.0 GB" in out, out[-4000:]
