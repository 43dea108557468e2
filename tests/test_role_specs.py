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


def _filter_names() -> set[str]:
    """Every filter the project's filter plugins define (imported, as Ansible's loader would)."""
    import importlib.util

    names: set[str] = set()
    for path in sorted(ROOT.glob("roles/*/filter_plugins/*.py")) + sorted(ROOT.glob("playbooks/filter_plugins/*.py")):
        spec = importlib.util.spec_from_file_location(f"_filters_{path.parent.parent.name}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "FilterModule"):
            names |= set(module.FilterModule().filters())
    return names


def test_the_service_plan_digest_covers_every_variable_the_plan_reads():
    """sglang_service keeps a plan rendered earlier in the run when the digest of its inputs is unchanged
    (tasks/plan.yml; vars/main.yml _sglang_service_plan_inputs: the options of its entry point `plan`,
    and the host reads the plan keeps). A variable the plan reads that is not among them would let a
    stale plan be kept: every sglang_service_* name in plan_render.yml and the templates must be an
    option of `plan`, a fact the plan sets itself, or one of the host reads the digest covers."""
    import re

    role = ROOT / "roles" / "sglang_service"
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options = set(specs["plan"]["options"])
    render = (role / "tasks" / "plan_render.yml").read_text()
    read = set()
    for path in [role / "tasks" / "plan_render.yml", *sorted((role / "templates").glob("*.j2"))]:
        read |= set(re.findall(r"\b_?sglang_service_[a-z0-9_]*[a-z0-9]\b", path.read_text()))
    # What the plan sets (set_fact keys and registered results): written by the plan, not read from outside.
    sets = set(re.findall(r"^\s+(_?sglang_service_[a-z0-9_]+):", render, re.M))
    sets |= set(re.findall(r"register:\s+(_?sglang_service_[a-z0-9_]+)", render))
    # Of those, the host reads kept for the run are in the digest itself (vars/main.yml).
    digest = (role / "vars" / "main.yml").read_text().split("_sglang_service_plan_inputs:", 1)[1]
    host_reads = {"_sglang_service_systemd_version", "_sglang_service_render_nodes", "_sglang_service_salt"}
    for name in host_reads:
        assert name in sets, f"{name} is no longer set by plan_render.yml: update this test and the digest"
        assert name in digest, f"the plan's digest (vars/main.yml _sglang_service_plan_inputs) leaves out {name}"
    # The plan's own locals (registered results and the loop's task vars) are read only where they are set.
    locals_ = {"_sglang_service_entry", "_sglang_service_salt_file", "_sglang_service_systemctl_version",
               "_sglang_service_dri", "_sglang_service_dri_dir", "_sglang_service_rendered",
               # The digest itself, recorded with the plan.
               "_sglang_service_plan_inputs"}
    uncovered = sorted(read - _filter_names() - options - sets - locals_)
    assert not uncovered, (
        f"plan_render.yml or a template reads {uncovered}, which the plan's digest does not cover: declare each "
        "as an option of sglang_service's entry point `plan` (meta/argument_specs.yml)"
    )
