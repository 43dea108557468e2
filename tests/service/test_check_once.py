"""The service checks run once per plan and run: a plan that passed them (sglang_service_validated) is not
checked again (preflight's call of the entry point check, then the stage's validate, share tasks/checks.yml),
and a plan that changed in between is checked again. Real Ansible on localhost: sglang_service's entry point
check, three times."""

from __future__ import annotations

import re

from service_render import run_check

PORT_TASK = "Checks | who holds each instance's port on the host"

# After the first check (service_render.CHECK_PLAYBOOK): the same plan again, a change, once more.
AFTER = """
    - name: Check (2), nothing changed
      ansible.builtin.include_role: {name: sglang_service, tasks_from: check, public: true}
    - name: A change between the two (the environment)
      ansible.builtin.set_fact:
        sglang_service_environment: "{{ sglang_service_environment | combine({'HICACHE_FLEET_TEST': '1'}) }}"
    - name: Check (3)
      ansible.builtin.include_role: {name: sglang_service, tasks_from: check, public: true}
    - name: Say the digest and the findings
      ansible.builtin.debug:
        msg: "passed {{ sglang_service_validated }} findings {{ sglang_service_findings | length }}"
"""


def test_a_plan_is_checked_once_per_run_and_again_after_a_change(tmp_path):
    extra = {
        "sglang_service_hicache_enabled": False,
        # A port nothing here listens on (the check reads who holds it on this machine).
        "sglang_service_instances": [{"name": "main", "port": 30987}],
    }
    run = run_check(tmp_path, extra, AFTER)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # The port check ran in checks 1 and 3, not in 2 (the same plan, already passed).
    ran = re.findall(r"TASK \[sglang_service : " + re.escape(PORT_TASK) + r"\][^\n]*\n(ok|skipping)", run.stdout)
    assert ran == ["ok", "ok"], run.stdout[-6000:]
    assert re.search(r"passed [0-9a-f]{64} findings\s+0", run.stdout), run.stdout[-2000:]


# The plan is rendered once per host and run where its inputs did not change (tasks/plan.yml): check (2)
# keeps the plan of check (1); a changed environment, then a changed python (the venv release the venv
# phase built, playbooks/vars/service_release.yml), each render it again, and the plan then names them.
RENDER_TASK = "Plan | merge profile, HiCache args and overrides per instance"
AGAIN = """
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
    - name: Say what the last plan's unit and env file hold
      ansible.builtin.debug:
        msg: >-
          env-test {{ _sglang_service_env_contents.main is search('HICACHE_FLEET_TEST') }}
          python-new {{ _sglang_service_plan[0].unit_content is search('/opt/sglang/venvs/newer/bin/python') }}
          kept {{ _sglang_service_plan_kept }}
"""


def test_a_plan_is_rendered_once_per_run_and_again_after_any_change_of_its_inputs(tmp_path):
    extra = {
        "sglang_service_hicache_enabled": False,
        "sglang_service_instances": [{"name": "main", "port": 30987}],
    }
    run = run_check(tmp_path, extra, AGAIN)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # Rendered in checks 1, 3 and 4; check 2 kept the plan of check 1 (the assert above: the same plan).
    rendered = re.findall(r"TASK \[sglang_service : " + re.escape(RENDER_TASK), run.stdout)
    assert len(rendered) == 3, run.stdout[-6000:]
    assert re.search(r"env-test True\s+python-new True\s+kept False", run.stdout), run.stdout[-3000:]
