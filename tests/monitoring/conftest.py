"""Render roles/monitoring's files (tasks inputs.yml + render.yml, the role's own filters and
templates) for a small test inventory, through ansible-playbook on localhost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from monitoring_inputs import HOSTS, RECORD, promtool

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> Path:
    promtool()
    out = tmp_path_factory.mktemp("monitoring")
    records = out / "records"
    records.mkdir()
    for host in ("h1", "h3"):
        (records / f"{host}.json").write_text(json.dumps(RECORD))
    inventory = {"sglang_hosts": {"hosts": {h: {"ansible_host": a, "ansible_connection": "local",
                                                "ansible_python_interpreter": sys.executable}
                                            for h, a in HOSTS.items()}}}
    (out / "hosts.yml").write_text(yaml.safe_dump(inventory))
    play = [{
        "hosts": "h1", "gather_facts": False,
        "vars_files": [str(ROOT / "roles" / "monitoring" / "defaults" / "main.yml")],
        "tasks": [{"ansible.builtin.include_role": {"name": "monitoring", "tasks_from": name}}
                  for name in ("inputs", "render")],
    }]
    (out / "render.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    extra = {
        "monitoring_service": False,
        "monitoring_config_dir": str(out / "etc"),
        "monitoring_dashboard_dir": str(out / "grafana"),
        # The slurp loop's item is the host: each reads its own record (absent for h2).
        "monitoring_validated_record_path": str(records) + "/{{ item }}.json",
        "monitoring_router_target": "127.0.22.9:29000",
    }
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
           "ANSIBLE_FACT_CACHING": "memory", "ANSIBLE_NOCOLOR": "1"}
    (out / "etc").mkdir()
    run = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(out / "hosts.yml"), str(out / "render.yml"),
                          "-e", json.dumps(extra)], env=env, capture_output=True, text=True, timeout=300,
                         check=False, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return out
