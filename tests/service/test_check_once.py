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
