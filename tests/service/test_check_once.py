"""The service plan is rendered, and checked, once per plan and run. A plan rendered earlier in the run is
kept while the digest of its inputs is unchanged (tasks/plan.yml), and a plan that passed the checks
(sglang_service_validated) is not checked again (preflight's call of the entry point check, then the
stage's validate, share tasks/checks.yml); after any change of its inputs it is rendered and checked again.
Real Ansible on localhost: sglang_service's entry point check, four times, in one run both tests read."""

from __future__ import annotations

import re

import pytest
from service_render import run_check

PORT_TASK = "Checks | who holds each instance's port on the host"
RENDER_TASK = "Plan | merge profile, HiCache args and overrides per instance"

# After the first check (service_render.CHECK_PLAYBOOK): the same inputs again (the plan kept, not
# checked again), a changed environment, then a changed python (the venv release the venv phase built,
# playbooks/vars/service_release.yml): each renders and checks the plan again, which then names them.
AFTER = """
    - name: Remember the first plan
      ansible.builtin.set_fact:
        first_plan: "{{ _sglang_service_plan }}"
    - name: Check (2), nothing changed
      ansible.builtin.include_role: {name: sglang_service, tasks_from: check, public: true}
    - name: The kept plan is the first one
      ansible.builtin.assert:
        that: _sglang_service_plan == first_plan
    - name: A change between the two (the environment)
      ansible.builtin.set_fact:
        sglang_service_environment: "{{ sglang_service_environment | combine({'HICACHE_FLEET_TEST': '1'}) }}"
    - name: Check (3)
      ansible.builtin.include_role: {name: sglang_service, tasks_from: check, public: true}
    - name: A new venv release between the two
      ansible.builtin.set_fact:
        sglang_service_python: /opt/sglang/venvs/newer/bin/python
    - name: Check (4)
      ansible.builtin.include_role: {name: sglang_service, tasks_from: check, public: true}
    - name: Say the digest, the findings and what the last plan's unit and env file hold
      ansible.builtin.debug:
        msg: >-
          passed {{ sglang_service_validated }} findings {{ sglang_service_findings | length }}
          env-test {{ _sglang_service_env_contents.main is search('HICACHE_FLEET_TEST') }}
          python-new {{ _sglang_service_plan[0].unit_content is search('/opt/sglang/venvs/newer/bin/python') }}
          kept {{ _sglang_service_plan_kept }}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    extra = {
        "sglang_service_hicache_enabled": False,
        # A port nothing here listens on (the check reads who holds it on this machine).
        "sglang_service_instances": [{"name": "main", "port": 30987}],
    }
    run = run_check(tmp_path_factory.mktemp("check_once"), extra, AFTER)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run


def test_a_plan_is_checked_once_per_run_and_again_after_a_change(run):
    # The port check ran in checks 1, 3 and 4, not in 2 (the same plan, already passed).
    ran = re.findall(r"TASK \[sglang_service : " + re.escape(PORT_TASK) + r"\][^\n]*\n(ok|skipping)", run.stdout)
    assert ran == ["ok", "ok", "ok"], run.stdout[-6000:]
    assert re.search(r"passed [0-9a-f]{64} findings\s+0", run.stdout), run.stdout[-2000:]


def test_a_plan_is_rendered_once_per_run_and_again_after_any_change_of_its_inputs(run):
    # Rendered in checks 1, 3 and 4; check 2 kept the plan of check 1 (the assert in AFTER: the same plan).
    rendered = re.findall(r"TASK \[sglang_service : " + re.escape(RENDER_TASK), run.stdout)
    assert len(rendered) == 3, run.stdout[-6000:]
    assert re.search(r"env-test True\s+python-new True\s+kept False", run.stdout), run.stdout[-3000:]
