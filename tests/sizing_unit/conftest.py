"""Fixtures of the sizing unit tests: release directories built from the sglang_service role's real plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The role's plan on localhost (as tests/service/test_secrets.py renders it): each instance's unit text
# and launch argv, written out as JSON.
PLAYBOOK = json.dumps([{
    "hosts": "localhost", "connection": "local", "gather_facts": False,
    "tasks": [
        {"ansible.builtin.include_role": {"name": "sglang_service", "tasks_from": "plan.yml"}},
        {"ansible.builtin.copy": {"content": "{{ _sglang_service_plan | to_json }}",
                                  "dest": "{{ out }}/plan.json", "mode": "0600"}},
    ],
}])


@pytest.fixture(scope="session")
def plan(tmp_path_factory) -> dict:
    """The plan of two instances: `main` with an api key (its unit loads the secrets credential) and
    `open` without one, HiCache on; by instance name."""
    out = tmp_path_factory.mktemp("plan")
    (out / ".secrets-salt").write_text("salt\n")
    (out / "render.yml").write_text(PLAYBOOK)
    variables = {
        "out": str(out),
        "ansible_python_interpreter": sys.executable,
        "sglang_service_state_dir": str(out),
        "sglang_service_model_path": "/srv/models/main",
        "sglang_service_draft_model_path": "/srv/models/draft",
        "sglang_service_api_key": "k-sizing-test",
        "sglang_service_instances": [{"name": "main", "port": 30004}, {"name": "open", "port": 30006, "api_key": ""}],
    }
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_FACT_CACHING="memory", ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(out / "render.yml"),
         "-e", json.dumps(variables)],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return {entry["name"]: entry for entry in json.loads((out / "plan.json").read_text())}
