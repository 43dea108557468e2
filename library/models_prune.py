#!/usr/bin/python
# hicache-fleet: remove the model copies no kept release reads, in one call (roles/models tasks/prune.yml).
# Runs on the managed host with its system Python: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: models_prune
short_description: Remove the model store copies, downloads and old links that no kept path names
description:
  - >-
    Lists the entries of C(<models_dir>/.store) and C(<models_dir>/.staging) and the links directly
    in O(models_dir) that point into C(<models_dir>/.store/) (the earlier layout's
    C(models_dir/<name>)); removes every one that no kept path names. A kept path keeps an entry when
    it is that entry or lies inside it.
  - >-
    Kept are O(keep), what each kept link resolves to and its target as written, and O(plan_paths)
    (the newest staged revisions). Links elsewhere and files outside those places are never touched.
  - >-
    Refuses an empty O(keep), a relative entry in it, or one that names nothing under O(models_dir),
    before anything is read or removed.
  - Check mode removes nothing and reports what would go; C(--diff) lists it.
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
options:
  models_dir:
    description: The models directory (the role's C(models_dir)).
    type: str
    required: true
  keep:
    description: The model paths of the host's current, previous and validated releases (absolute paths).
    type: list
    elements: str
    required: true
  plan_paths:
    description: Paths of the current plan that are kept besides O(keep) (its store copies and downloads).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    description: Reads as in a real run and removes nothing; says what would go (RV(removed)).
    support: full
  diff_mode:
    description: Lists what goes (or would go) as the diff's C(before).
    support: full
"""

EXAMPLES = r"""
- name: Remove the model copies no kept release reads
  models_prune:
    models_dir: /srv/sglang/models
    keep: [/srv/sglang/models/.store/demo-27b-w4a16-f2ca2741c2a4]
    plan_paths: [/srv/sglang/models/.store/demo-27b-w4a16-f2ca2741c2a4]
"""

RETURN = r"""
kept:
  description: Every kept path (the keep list, what its links resolve to, the plan's paths).
  returned: always
  type: list
  elements: str
removed:
  description: The entries removed (in check mode, those that would be; when a removal fails, those removed before it).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.fleet_models_prune import ARGUMENT_SPEC, PruneError, prune


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        result = prune(params["models_dir"], params["keep"], params["plan_paths"], module.check_mode)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    except PruneError as exc:
        module.fail_json(msg=str(exc), removed=exc.removed)
    except OSError as exc:
        module.fail_json(msg=f"roles/models prune: could not read or remove under {params['models_dir']}: {exc}")
    diff = result.pop("diff")
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
