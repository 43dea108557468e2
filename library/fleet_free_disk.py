#!/usr/bin/python
# hicache-fleet: free disk for what a run stages, summed per filesystem (read only).
# Runs on the managed host with its system Python: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_free_disk
short_description: Check that the free disk under some paths holds what a run will stage there
description:
  - >-
    Each need names a path, the bytes a run will write under it, what needs them and how to fix a
    shortfall. The free space (for an unprivileged writer, as C(df) shows it) of the filesystem under
    each path's nearest existing parent is read once; needs on one filesystem are summed, because
    C(/), C(/opt) and the model store often are one.
  - >-
    Returns RV(findings), one sentence per filesystem that is short. With O(fail_msg) the module
    fails when there is one (O(fail_msg), then each finding); without it, it returns them for the
    caller to collect (the preflight role lists every problem of a host at once).
  - The one implementation of the free-disk check, used by the preflight and models roles.
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
options:
  needs:
    description:
      - What will be staged, each a mapping of C(path) (absolute), C(need_bytes), C(what) and C(fix).
      - A need of 0 bytes (a stage this run skips) counts for nothing.
    type: list
    elements: dict
    required: true
  host:
    description: The host's name as the findings give it (the inventory name).
    type: str
    required: true
  fail_msg:
    description:
      - Fail when a filesystem is short, with this sentence followed by the numbered findings.
      - Omitted, the findings are returned and the module does not fail.
    type: str
attributes:
  check_mode:
    description: Reads only; runs the same in check mode.
    support: full
  diff_mode:
    description: Nothing is changed, so there is nothing to show.
    support: none
"""

EXAMPLES = r"""
- name: Free disk for the model
  fleet_free_disk:
    needs:
      - path: /srv/models
        need_bytes: 16000000000
        what: Qwen3-32B-GPTQ-Int4
        fix: Free space there, or change models_dir.
    host: "{{ inventory_hostname }}"
    fail_msg: not enough free disk on {{ inventory_hostname }}; nothing was fetched
"""

RETURN = r"""
findings:
  description: One sentence per filesystem whose free space does not hold the needs on it.
  returned: always
  type: list
  elements: str
filesystems:
  description: The free bytes of each filesystem measured, by its mount point.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.fleet_free_disk import ARGUMENT_SPEC, check, failure_message, validate_needs


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    needs = module.params["needs"]
    errors = validate_needs(needs)
    if errors:
        module.fail_json(msg="invalid needs: " + "; ".join(errors))
    try:
        result = check(needs, module.params["host"])
    except OSError as exc:
        module.fail_json(msg=f"could not read the free disk: {exc}")
    if result["findings"] and module.params["fail_msg"]:
        module.fail_json(msg=failure_message(result["findings"], module.params["fail_msg"]), **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
