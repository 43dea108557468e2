#!/usr/bin/python
# hicache-fleet: write or remove the temporary systemd unit of one HiCache sizing candidate.
# Runs on the managed host with its system Python: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_sizing_unit
short_description: Write or remove the temporary systemd unit that runs one HiCache sizing candidate
description:
  - >-
    The HiCache sizing sweep runs each candidate config from a temporary unit derived from the host's
    current release, so the release (C(<state>/<instance>/current -> releases/<id>/)) never changes.
  - >-
    O(state=present) reads the release's C(unit) (the exact text systemd runs for the real instance)
    and C(argv.json) (SGLang's argv) in O(release_dir) and writes O(unit_dir)/O(name): the release's unit
    with ExecStart rebuilt from C(argv.json) with O(args) applied (a flag keeps its place, a new flag is
    appended, null drops it; quoted as the sglang_service role quotes; the C(--config %d/secrets.yaml)
    tail and C(LoadCredential=) kept when present), C(Restart=no), C(RuntimeMaxSec=)O(runtime_max_sec),
    C(Conflicts=) and C(OnFailure=) the real O(unit) (starting the candidate stops the real instance; when
    the candidate fails or hits RuntimeMaxSec, systemd starts the real instance again), a Description
    naming it a sizing candidate and no C([Install]) section. Every other line (user, sandboxing,
    environment file, C(LimitMEMLOCK), paths, caches) is the release's. The file is mode C(0644),
    written atomically; C(systemctl daemon-reload) runs when its content changed.
  - >-
    O(state=absent) removes the file (stopping the candidate is the caller's) and reloads systemd if
    it existed.
  - >-
    Refused, before anything is written: a release directory without C(unit) or C(argv.json), a
    release whose unit's ExecStart does not run what C(argv.json) says (edited by hand), a release
    of another unit (its C(release.json)), a flag in O(args) that is not a string starting with C(--)
    or is one of C(--config), C(--api-key), C(--admin-api-key), O(name) equal to O(unit).
  - The logic lives in module_utils/sglang_sizing_unit.py (tested on its own).
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
options:
  state:
    description: Whether the candidate unit file is there.
    type: str
    choices: [present, absent]
    default: present
  release_dir:
    description:
      - The release the candidate derives from (an absolute path, e.g. C(/var/lib/sglang/main/current)).
      - Required with O(state=present).
    type: path
  unit:
    description: The real instance's unit name, e.g. C(sglang-main.service).
    type: str
    required: true
  args:
    description:
      - >-
        SGLang flag overrides, flag to value, e.g. C({"--hicache-size": 16, "--mem-fraction-static": "0.85"}).
      - A value is one word, a list an nargs flag, C(true) a switch; C(null) or C(false) drop the flag.
    type: dict
    default: {}
  name:
    description: The candidate unit's name; default C(<stem of unit>-sizing.service).
    type: str
  runtime_max_sec:
    description:
      - The candidate's C(RuntimeMaxSec=) (seconds, above 0). Required with O(state=present).
      - After it, systemd stops the candidate and starts the real unit (the sweep's controller may be gone).
    type: int
  unit_dir:
    description: Where the candidate unit is written; the default is systemd's runtime directory (gone at reboot).
    type: path
    default: /run/systemd/system
  daemon_reload:
    description: Run C(systemctl daemon-reload) when the unit file changed (off for tests outside systemd).
    type: bool
    default: true
attributes:
  check_mode:
    description: Writes and removes nothing, reloads nothing; reports what it would change, with its diff.
    support: full
  diff_mode:
    description: The unit file before and after.
    support: full
"""

EXAMPLES = r"""
- name: Sizing | the candidate's temporary unit
  sglang_sizing_unit:
    release_dir: /var/lib/sglang/main/current
    unit: sglang-main.service
    args:
      "--hicache-size": 16
      "--mem-fraction-static": "0.85"
    runtime_max_sec: 1800
  register: candidate

- name: Sizing | remove the candidate's unit (after stopping it)
  sglang_sizing_unit:
    unit: sglang-main.service
    state: absent
"""

RETURN = r"""
path:
  description: The candidate unit file.
  returned: always
  type: str
  sample: /run/systemd/system/sglang-main-sizing.service
name:
  description: The candidate unit's name.
  returned: always
  type: str
  sample: sglang-main-sizing.service
unit_sha1:
  description: sha1 of the candidate unit's text.
  returned: with O(state=present)
  type: str
  sample: 2fd4e1c67a2d28fced849ee1bb76e7391b93eb12
argv:
  description:
    - The SGLang argv the candidate runs (the release's with O(args) applied; C(--config) names the candidate
      unit's own credentials directory).
  returned: with O(state=present)
  type: list
  elements: str
  sample: ["--model-path", "/srv/models/main", "--hicache-size", "16"]
reloaded:
  description: Whether C(systemctl daemon-reload) ran.
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_sizing_unit import SizingUnitError, ensure


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "release_dir": {"type": "path"},
            "unit": {"type": "str", "required": True},
            "args": {"type": "dict", "default": {}},
            "name": {"type": "str"},
            "runtime_max_sec": {"type": "int"},
            "unit_dir": {"type": "path", "default": "/run/systemd/system"},
            "daemon_reload": {"type": "bool", "default": True},
        },
        required_if=[("state", "present", ("release_dir", "runtime_max_sec"))],
        supports_check_mode=True,
    )
    try:
        result = ensure(module.params, module.check_mode)
    except SizingUnitError as exc:
        module.fail_json(msg=f"sglang_sizing_unit: {exc}. Nothing was written.")
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"sglang_sizing_unit: {exc}")
    reload = result.pop("reload")
    diff = result.pop("diff")
    result["reloaded"] = False
    if reload and module.params["daemon_reload"] and not module.check_mode:
        systemctl = module.get_bin_path("systemctl", required=True)
        rc, out, err = module.run_command([systemctl, "daemon-reload"])
        if rc != 0:
            module.fail_json(msg=f"sglang_sizing_unit: systemctl daemon-reload failed ({rc}): {err or out}",
                             path=result["path"])
        result["reloaded"] = True
    if module._diff and result["changed"]:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
