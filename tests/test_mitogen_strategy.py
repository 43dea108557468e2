"""The optional Mitogen strategy is one setting away: with the pinned controller venv and the project's
ansible.cfg, ANSIBLE_STRATEGY=mitogen_linear alone runs a play through Mitogen (the task's parent is a
Mitogen interpreter), the default runs Ansible's own linear strategy (no Mitogen), and an
ansible-playbook that cannot import Mitogen stops with a message naming the setting and the fix.
Real ansible-playbook on localhost (local connection, which Mitogen runs as mitogen_local)."""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"

PLAY = """---
- name: Who runs the task
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  tasks:
    - name: The parent of the shell
      ansible.builtin.shell: ps -o args= -p "$PPID"
      register: parent
      changed_when: false
    - name: Print it
      ansible.builtin.debug:
        msg: "PARENT={{ parent.stdout }}"
    - name: The CPUs a process the task starts may run on
      ansible.builtin.command:
        argv: ["{{ ansible_playbook_python }}", -c, "import os; print(sorted(os.sched_getaffinity(0)))"]
      register: cpus
      changed_when: false
    - name: Print them
      ansible.builtin.debug:
        msg: "CPUS={{ cpus.stdout }}"
"""


def run(tmp_path: Path, strategy: str | None, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_DEPRECATION_WARNINGS="False")
    if strategy:
        env["ANSIBLE_STRATEGY"] = strategy
    env.update(extra_env or {})
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(play)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def printed(result: subprocess.CompletedProcess, key: str) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [line] = [line for line in result.stdout.splitlines() if f"{key}=" in line]
    return line.split(f"{key}=", 1)[1].strip().strip('"')


def parent(result: subprocess.CompletedProcess) -> str:
    return printed(result, "PARENT")


def test_one_setting_runs_the_play_through_mitogen(tmp_path: Path) -> None:
    assert "mitogen" in parent(run(tmp_path, "mitogen_linear"))


def test_default_is_the_plain_linear_strategy(tmp_path: Path) -> None:
    assert "mitogen" not in parent(run(tmp_path, None))


def test_mitogen_pins_no_process_to_a_cpu(tmp_path: Path) -> None:
    # Mitogen's own policy pins the workers and their subprocesses to one CPU on a 2- or 3-CPU machine
    # (strategy_plugins/mitogen_linear.py turns it off): the task's shell may run where this test may.
    allowed = str(sorted(os.sched_getaffinity(0)))
    assert printed(run(tmp_path, "mitogen_linear"), "CPUS") == allowed
    assert printed(run(tmp_path, None), "CPUS") == allowed


@pytest.mark.skipif(len(os.sched_getaffinity(0)) not in (2, 3), reason="Mitogen's policy pins only on 2 or 3 CPUs")
def test_mitogen_policy_back_on_pins_the_task_to_one_cpu(tmp_path: Path) -> None:
    # What the setting turns off, seen on this machine: with it, the task runs on one CPU only.
    cpus = printed(run(tmp_path, "mitogen_linear", {"HICACHE_FLEET_MITOGEN_AFFINITY": "1"}), "CPUS")
    assert len(ast.literal_eval(cpus)) == 1, cpus


def test_without_mitogen_the_error_names_the_setting_and_the_fix(tmp_path: Path) -> None:
    # An ansible_mitogen that cannot be imported, first on the path: as if the package were missing.
    shadow = tmp_path / "shadow" / "ansible_mitogen"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no module named ansible_mitogen (test shadow)')\n")
    result = run(tmp_path, "mitogen_linear", {"PYTHONPATH": str(shadow.parent)})
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "ANSIBLE_STRATEGY=mitogen_linear needs Mitogen" in out, out[-3000:]
    assert "make setup" in out
    assert "unset ANSIBLE_STRATEGY" in out


@pytest.mark.parametrize("path", ["requirements/controller.in", "requirements/controller.txt"])
def test_mitogen_is_pinned_in_the_controller_requirements(path: str) -> None:
    pins = [line.strip() for line in (ROOT / path).read_text().splitlines() if line.startswith("mitogen")]
    assert [pin.split("==")[0] for pin in pins] == ["mitogen"], pins
