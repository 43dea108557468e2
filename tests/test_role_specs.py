"""Each role's defaults satisfy its own argument specs (meta/argument_specs.yml), entry point by
entry point, as ansible-core's validate_argument_spec checks them when the role is included.
A default that its spec rejects would fail every play that includes the role without setting it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p.parent.parent for p in ROOT.glob("roles/*/meta/argument_specs.yml"))
BIN = Path(sys.executable).parent


def entry_points(role: Path) -> list[str]:
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return [name for name, spec in specs.items() if spec.get("options")]


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_defaults_pass_the_role_argument_specs(role, tmp_path):
    points = entry_points(role)
    assert points, f"{role.name} has argument specs without options"
    tasks = [
        {
            "name": f"{role.name}:{point}",
            "ansible.builtin.validate_argument_spec": {
                "argument_spec": "{{ (lookup('file', spec_file) | from_yaml).argument_specs[point].options }}"
            },
            "vars": {"spec_file": str(role / "meta" / "argument_specs.yml"), "point": point},
        }
        for point in points
    ]
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [str(role / "defaults" / "main.yml")],
            "tasks": tasks,
        }
    ]
    playbook = tmp_path / "specs.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FACT_CACHING": "memory",
           "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"ok={len(points)} " in result.stdout, result.stdout[-2000:]


def options(spec: dict):
    """Every option of an entry point, suboptions included, as (name, option) pairs."""
    for name, opt in (spec.get("options") or {}).items():
        yield name, opt
        yield from options(opt)


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_specs_hold_when_preflight_validates_every_entry_point_at_once(role):
    """preflight has each role check its variables against all of its entry points merged (the
    role's entry point argument_check): a templated default of a typed option is a string to any
    check that does not render it, and an option required by one entry point is required of every
    inventory."""
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    problems = []
    for point, spec in specs.items():
        for name, opt in options(spec):
            default = opt.get("default")
            if isinstance(default, str) and "{{" in default and opt.get("type", "str") not in ("str", "path", "raw"):
                problems.append(f"{point}.{name}: templated default of type {opt['type']}")
            if point != "main" and opt.get("required") and name in (spec.get("options") or {}):
                problems.append(f"{point}.{name}: required outside the main entry point")
    assert not problems, problems
