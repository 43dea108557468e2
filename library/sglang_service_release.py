#!/usr/bin/python
# hicache-fleet: stage the candidate SGLang service release on the host, in one module call.
# Runs on the managed host with its system Python: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_service_release
short_description: Keep the candidate SGLang service release on the host and say which instances it would restart
description:
  - >-
    The last step of the sglang_service role's C(stage): for each instance, compare its live unit,
    environment file and secrets file with the candidate (read only: nothing a running instance
    reads changes), and keep the candidate as the release directory O(instances[].release_dir)
    with the files C(unit), C(argv.json), C(release.json), C(env) and, for an instance with API
    keys, C(secrets.yaml).
  - >-
    The directory is created mode C(0700), the files are written atomically (a temporary file in
    the same directory, then a rename), mode C(0600); both root-owned when the module runs as root.
    A file already there with the same content, owner and mode is left alone: staging the same
    release again is not a change.
  - >-
    Check mode writes nothing and reports what it would write. No diff is shown: the release files
    are copies of files whose own tasks show their diff when they are installed (and some hold keys).
  - The logic lives in module_utils/sglang_service_release.py (tested on its own).
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
options:
  instances:
    description:
      - The instances of the candidate release, as the sglang_service plan renders them.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The instance's name.
        type: str
        required: true
      unit_path:
        description: The live unit file, compared with O(instances[].unit).
        type: path
        required: true
      env_path:
        description: The live environment file, compared with O(env).
        type: path
        required: true
      secrets_path:
        description: The live secrets file; an instance without keys must have none.
        type: path
        required: true
      release_dir:
        description: The release directory to keep the candidate in (an absolute path).
        type: path
        required: true
      unit:
        description: The candidate unit file's content.
        type: str
        required: true
      argv_json:
        description: The content of C(argv.json) (the launch argv; keys only in the secrets file).
        type: str
        required: true
      release_json:
        description: The content of C(release.json) (what the release is and what it runs from).
        type: str
        required: true
  env:
    description:
      - Each instance's candidate environment file, by instance name (a missing name is an empty file).
    type: dict
    default: {}
  secrets:
    description:
      - Each instance's candidate secrets file (SGLang's C(--config) YAML with its API keys), by
        instance name; empty or missing for an instance without keys.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Release | keep the candidate as a release and compare it with the live files
  sglang_service_release:
    instances:
      - name: main
        unit_path: /etc/systemd/system/sglang-main.service
        env_path: /etc/sglang/main.env
        secrets_path: /etc/sglang/main.secrets.yaml
        release_dir: /var/lib/sglang/main/releases/0123456789ab
        unit: "{{ unit_text }}"
        argv_json: "{{ argv | to_nice_json }}\n"
        release_json: "{{ record | to_nice_json }}\n"
    env: {main: "{{ env_text }}"}
    secrets: {}
  register: staged
"""

RETURN = r"""
pending:
  description: Names of the instances whose live unit, env or secrets file differs from the candidate.
  returned: always
  type: list
  elements: str
  sample: [main]
live_units:
  description:
    - Per instance (in the order of O(instances)), whether its live unit file exists and its sha256,
      shaped as M(ansible.builtin.stat)'s result (C(stat.exists), C(stat.checksum)).
  returned: always
  type: list
  elements: dict
  sample: [{stat: {exists: true, checksum: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}}]
written:
  description: The release directory and files created or rewritten (in check mode, that would be).
  returned: always
  type: list
  elements: str
  sample: [/var/lib/sglang/main/releases/0123456789ab, /var/lib/sglang/main/releases/0123456789ab/unit]
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_service_release import stage

INSTANCE_OPTIONS = {
    "name": {"type": "str", "required": True},
    "unit_path": {"type": "path", "required": True},
    "env_path": {"type": "path", "required": True},
    "secrets_path": {"type": "path", "required": True},
    "release_dir": {"type": "path", "required": True},
    "unit": {"type": "str", "required": True},
    "argv_json": {"type": "str", "required": True},
    "release_json": {"type": "str", "required": True},
}


def main():
    module = AnsibleModule(
        argument_spec={
            "instances": {"type": "list", "elements": "dict", "required": True, "options": INSTANCE_OPTIONS},
            "env": {"type": "dict", "default": {}, "no_log": True},
            "secrets": {"type": "dict", "default": {}, "no_log": True},
        },
        supports_check_mode=True,
    )
    for instance in module.params["instances"]:
        if not instance["release_dir"].startswith("/"):
            module.fail_json(msg=f"instance {instance['name']}: release_dir {instance['release_dir']!r} "
                                 "is not an absolute path")
    # root:root when running as root (as the copy tasks this replaces required).
    owner = (0, 0) if os.geteuid() == 0 else None
    try:
        result = stage(module.params["instances"], module.params["env"] or {}, module.params["secrets"] or {},
                       module.check_mode, owner)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"staging the release failed: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
