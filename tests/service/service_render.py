"""Run the sglang_service role on localhost through Ansible: its plan rendered (test_render.py,
test_unit_gpu.py, ...) and its entry point check (test_check_once.py, test_check_sim_ram.py, test_l3_check.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The role's plan phase on localhost: every instance's unit file and the whole plan as JSON in `out`.
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: sglang_service
        tasks_from: plan.yml
    - ansible.builtin.copy:
        content: "{{ item.unit_content }}"
        dest: "{{ out }}/{{ item.unit }}"
        mode: "0644"
      loop: "{{ _sglang_service_plan }}"
      loop_control:
        label: "{{ item.unit }}"
    - ansible.builtin.copy:
        content: "{{ _sglang_service_plan | to_json }}"
        dest: "{{ out }}/plan.json"
        mode: "0644"
"""


def _variables(out: Path, extra_vars: dict) -> dict:
    return {
        "out": str(out),
        "ansible_python_interpreter": sys.executable,
        "sglang_service_model_path": "/srv/models/main",
        "sglang_service_draft_model_path": "/srv/models/draft",
        **extra_vars,
    }


def run_plan(out: Path, extra_vars: dict) -> Path:
    """Render the plan (PLAYBOOK) into `out` with the role's model paths and `extra_vars`; `out`."""
    (out / "render.yml").write_text(PLAYBOOK, encoding="utf-8")
    _play(["-i", "localhost,", str(out / "render.yml"), "-e", json.dumps(_variables(out, extra_vars))])
    return out


def run_plans(work: Path, cases: dict[str, tuple[Path, dict]]) -> None:
    """One run of the plan for several independent cases: each case an inventory host (connection local,
    this machine) with its own variables as host variables, rendered into its own `out` directory."""
    hosts = {name: {**_variables(out, extra_vars), "ansible_connection": "local"}
             for name, (out, extra_vars) in cases.items()}
    (work / "hosts.yml").write_text(json.dumps({"all": {"hosts": hosts}}), encoding="utf-8")
    (work / "render.yml").write_text(PLAYBOOK.replace("- hosts: localhost", "- hosts: all"), encoding="utf-8")
    _play(["-i", str(work / "hosts.yml"), str(work / "render.yml")])


# The role's entry point check on localhost, then the caller's own tasks (`after`, indented as tasks).
CHECK_PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Check
      ansible.builtin.include_role: {name: sglang_service, tasks_from: check, public: true}
"""

# Tasks after the check that fail with its findings (the stage's verdict, for a test).
FAIL_WITH_FINDINGS = """
    - name: Fail with the findings
      ansible.builtin.fail:
        msg: "{{ sglang_service_findings | join(' | ') }}"
      when: sglang_service_findings | length > 0
"""


def run_check(work: Path, extra_vars: dict, after: str = "") -> subprocess.CompletedProcess:
    """The entry point check with the role's model paths and `extra_vars`, then the tasks `after`; the
    finished run, whatever it returned (the caller asserts on it)."""
    return run_playbook(work, CHECK_PLAYBOOK + after, extra_vars)


def run_playbook(work: Path, playbook: str, extra_vars: dict, *options: str) -> subprocess.CompletedProcess:
    """`playbook` (text) on localhost with the role's model paths, `extra_vars` and ansible-playbook
    `options` (e.g. --check); the finished run, whatever it returned."""
    (work / "play.yml").write_text(playbook, encoding="utf-8")
    variables = {key: value for key, value in _variables(work, extra_vars).items() if key != "out"}
    return _run(["-i", "localhost,", *options, str(work / "play.yml"), "-e", json.dumps(variables)])


def _play(args: list[str]) -> None:
    run = _run(args)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
        ANSIBLE_FACT_CACHING="memory",
        ANSIBLE_NOCOLOR="1",
    )
    playbook_bin = Path(sys.executable).parent / "ansible-playbook"
    return subprocess.run(
        [str(playbook_bin), *args], env=env, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )
