"""On a simulator host the RAM rules check the RAM the simulator was told (SGLANG_SIM_HOST_MEM_GB), which
stands for the machine's there: a sizing measured for a 256 GB host class passes preflight on a test host
told 256 GB and is refused, naming the figures, on one told 48 GB (whatever this machine has). Real
Ansible on localhost: sglang_service's entry point check, failing with its findings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Check
      ansible.builtin.include_role: {name: sglang_service, tasks_from: check, public: true}
    - name: Fail with the findings
      ansible.builtin.fail:
        msg: "{{ sglang_service_findings | join(' | ') }}"
      when: sglang_service_findings | length > 0
"""


def _run(tmp_path: Path, told_gb: str) -> subprocess.CompletedProcess:
    (tmp_path / "play.yml").write_text(PLAYBOOK, encoding="utf-8")
    extra = {
        "ansible_python_interpreter": sys.executable,
        "sglang_service_model_path": "/srv/models/main",
        "sglang_service_draft_model_path": "/srv/models/draft",
        "sglang_service_module": "sglang_sim.launch_server",
        "sglang_service_platform": "none",
        "sglang_service_hicache_args": {"--enable-hierarchical-cache": True, "--hicache-size": 96},
        "sglang_service_environment": {"SGLANG_SIM_HOST_MEM_GB": told_gb},
        "sglang_service_memory_reserve_gb": 16,
        "sglang_service_instances": [{"name": "main", "port": 30988}],
    }
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FACT_CACHING="memory", ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(tmp_path / "play.yml"),
         "-e", json.dumps(extra)],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )


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
