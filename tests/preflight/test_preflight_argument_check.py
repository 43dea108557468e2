"""Issue 23: each role checks its own variables against its own meta/argument_specs.yml (entry point
argument_check, which never fails and publishes <role>_argument_check); preflight imports it for each
role of preflight_validate_roles and lists the errors with its other findings.

One run of the REAL playbooks/preflight.yml on localhost serves two inventory hosts, both this
machine (connection local): `every` has one wrongly typed variable of each of the roles and the
default preflight_validate_roles, `subset` the same values with preflight_validate_roles: [preflight,
models]. Each host's findings are read from its own failure in the output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "sglang_service_model_path": "/srv/models/main",
    "sglang_service_draft_model_path": "/srv/models/draft",
    "sglang_service_hicache_enabled": False,
    "preflight_kernel_accept_unlisted": True,
    "sglang_service_instances": [{"name": "main", "port": 30987}],
    "preflight_check_models": False,
}

# role -> (variable, a value its spec refuses). None of them stops the service plan from rendering.
# preflight has none: every option of it is one of its main entry point, which Ansible checks when the
# role starts and fails at once (test_an_unknown_role_in_preflight_validate_roles_is_refused_naming_it).
BAD = {
    "rocm": ("rocm_amd_pin_priority", "high"),
    "sglang_venv": ("sglang_venv_keep_releases", "many"),
    "models": ("models_verify_existing", "perhaps"),
    "sglang_service": ("sglang_service_rollback_to", 5),
    "rollout": ("rollout_fast_path", "sure"),
    "rollout_gate": ("rollout_prune_venvs", "sure"),
    "rollout_router": ("rollout_router_wait_s", "long"),
}


def _run(tmp_path: Path, hosts: dict, extra: dict) -> subprocess.CompletedProcess:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"sglang_hosts": {"hosts": hosts}}), encoding="utf-8")
    (tmp_path / "extra.json").write_text(json.dumps(extra), encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FACT_CACHING="memory",
               ANSIBLE_NOCOLOR="1")
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
            str(ROOT / "playbooks/preflight.yml"), "-e", "@" + str(tmp_path / "extra.json")]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)


def _findings(stdout: str, host: str) -> list[str]:
    """The numbered findings of `host`'s preflight summary."""
    match = re.search(rf"(?ms)^fatal: \[{host}\]: FAILED! =>.*?^\s+msg: \|-\n(.*?)(?=^\S|\Z)", stdout)
    assert match, stdout[-4000:]
    assert "preflight found " in match.group(1).splitlines()[0], match.group(1)
    assert f"problem(s) on {host};" in match.group(1).splitlines()[0], match.group(1)
    return re.findall(r"(?m)^\s+\d+\. (.*)$", match.group(1))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    bad = {variable: value for variable, value in BAD.values()}
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {"every": dict(local, **bad),
             "subset": dict(local, preflight_validate_roles=["preflight", "models"], **bad)}
    result = _run(tmp_path_factory.mktemp("argument_check"), hosts, BASE)
    assert result.returncode == 2, result.stdout[-4000:] + result.stderr[-2000:]
    return result


def _spec_findings(findings: list[str], role: str) -> list[str]:
    return [f for f in findings if f"(roles/{role}/meta/argument_specs.yml); fix that variable" in f]


@pytest.mark.parametrize("role", list(BAD))
def test_each_roles_own_check_makes_its_wrong_type_a_finding(run, role):
    variable, _ = BAD[role]
    found = _spec_findings(_findings(run.stdout, "every"), role)
    assert len(found) == 1, found
    assert found[0].startswith(f"argument '{variable}' is of type"), found
    # The role's own entry point did the check (not preflight reading the role's file).
    assert f"TASK [{role} : Argument check | the {role} role's variables against its argument specs]" in run.stdout


def test_only_the_roles_of_preflight_validate_roles_are_checked(run):
    findings = _findings(run.stdout, "subset")
    for role in BAD:
        assert len(_spec_findings(findings, role)) == (1 if role == "models" else 0), (role, findings)
    assert not [f for f in findings if "were not checked" in f or "could not be checked" in f], findings


def test_no_entry_point_check_runs_for_argument_check_and_nothing_crashes(run):
    # rolespec_validate: false - argument_check has no options, so no task is spent validating them.
    assert "arg spec 'argument_check'" not in run.stdout
    # Every host failed once, in preflight's summary, not in a role's check.
    assert run.stdout.count("FAILED!") == 2, run.stdout[-4000:]
    assert "Validation of arguments failed" not in run.stdout


def test_an_unknown_role_in_preflight_validate_roles_is_refused_naming_it(tmp_path):
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    result = _run(tmp_path, {"localhost": local}, dict(BASE, preflight_validate_roles=["rollout", "router"]))
    assert result.returncode == 2, result.stdout[-3000:]
    refusal = re.search(r"(?m)^.*preflight_validate_roles.*$", result.stdout)
    assert refusal, result.stdout[-3000:]
    assert "router" in refusal.group(0), refusal.group(0)
    assert "arg spec 'main'" in result.stdout, result.stdout[-3000:]
    assert "TASK [preflight : Start this host's list of findings]" not in result.stdout
