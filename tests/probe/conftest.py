"""Fixtures of the probe tests: the probe's module_utils importable, option sets, Ansible runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ansible.module_utils
import pytest
from plugins import ROOT as REPO
from plugins import ansible_bin, ansible_env

# The probe's module_utils (module_utils/ at the checkout's root, ansible.cfg `module_utils`) under the
# name Ansible gives them, so tests import them as the module does: ansible.module_utils.sglang_probe_*.
if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))

from ansible.module_utils.sglang_probe_measure import ARGUMENT_SPEC


@pytest.fixture
def params():
    """Module options with the module's defaults, small enough for a fake server."""

    def make(**over: Any) -> dict:
        p = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
        p.update(input_len=512, cold_output_len=4, warm_output_len=2, repeats=1,
                 ready_timeout=2.0, flush_timeout=1.0, request_timeout=10.0)
        p.update(over)
        return p

    return make


PLAYBOOK = """\
- name: Run the probe once
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Probe
      sglang_cache_probe: {args}
      register: probe_result
      ignore_errors: true
    - name: Save the result for the test
      ansible.builtin.copy:
        content: "{{{{ probe_result | to_json }}}}"
        dest: "{dest}"
        mode: "0600"
      check_mode: false
"""


def run_module(tmp_path: Path, args: dict, check: bool = False, timeout: float = 180) -> dict:
    """Run the module through ansible-playbook (local connection) and return its registered result.

    The interpreter is the one running pytest: stdlib is all the module needs, and interpreter
    discovery on a developer machine may pick a shim that does not run."""
    dest = tmp_path / f"result-{len(list(tmp_path.glob('result-*')))}.json"
    playbook = tmp_path / "probe.yml"
    playbook.write_text(PLAYBOOK.format(args=json.dumps(args), dest=dest))
    cmd = [ansible_bin("ansible-playbook"), "-i", "localhost,", str(playbook),
           "-e", json.dumps({"ansible_python_interpreter": sys.executable})]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, cwd=REPO, env=ansible_env(tmp_path), capture_output=True, text=True,
                          timeout=timeout)
    if not dest.exists():
        pytest.fail(f"ansible-playbook saved no result (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    result = json.loads(dest.read_text())
    result["_rc"] = proc.returncode
    result["_stdout"] = proc.stdout
    return result


@pytest.fixture(scope="module")
def sim_model(tmp_path_factory):
    from sim_server import write_fixture_model

    return write_fixture_model(tmp_path_factory.mktemp("sim") / "seed-27b")


@pytest.fixture
def start_sim(sim_model, tmp_path):
    """Start simulators for one test; each is stopped by its PID afterwards, also on failure."""
    from sim_server import SimServer

    started: list = []

    def start(args: list[str], wait: bool = True, ready: bool = True, **env: str):
        server = SimServer(sim_model, args, tmp_path / f"sim-{len(started)}.log", wait=wait, ready=ready, **env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def ansible_run(tmp_path: Path):
    def run(args: dict, check: bool = False) -> dict:
        return run_module(tmp_path, args, check=check)

    return run
