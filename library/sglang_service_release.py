#!/usr/bin/python
# hicache-fleet: stage the candidate SGLang service release on the host, in one module call.
# Runs on the managed host with its system Python: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_service_release
short_description: Stage an SGLang service release on the host, make it the live one, or prune old ones
description:
  - >-
    O(state=staged), the last step of the sglang_service role's C(stage): for each instance, compare its live unit,
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
  - >-
    O(state=active), the install step of the role's C(activate): for each instance named in
    O(changing), the release C(<state_dir>/current) points at becomes C(<state_dir>/previous) (a
    unit found there without a C(current) pointer, installed before the role managed the instance,
    is first kept as the release C(releases/adopted-<sha12>/) and becomes C(previous)); then every
    instance's environment file (mode C(0600)), secrets file (C(0600), root's alone: the unit loads it as
    the systemd credential C(secrets.yaml); removed for an instance without keys) and unit (C(0644))
    are written where they differ, and C(current)
    points at O(instances[].release_dir). RV(restart) names the instances whose files changed. With
    C(--diff) it shows the unit and environment file changes (never the secrets file's).
  - >-
    O(state=prune), the role's C(prune): per instance, the release directories beyond the O(keep) newest
    (by mtime) go, never one a C(current) or C(previous) pointer names nor one in O(protect); then every
    JIT cache directory C(<cache_root>/<id>) whose release is not kept, and every L3 identity directory
    C(<l3_dir>/<name>/<id>) that neither the release the C(current) pointer names nor the planned one
    (O(instances[].l3)) uses. RV(kept_releases) holds the C(release.json) of every kept release (one
    that cannot be read is left out). Only real directories directly in those directories are listed
    and deleted: a symlink is never followed (a releases directory that is one is refused) and
    nothing below is. Check mode deletes nothing and reports what would go; C(--diff) shows the
    directories before and after.
  - The logic lives in module_utils/sglang_service_release.py (tested on its own).
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
options:
  state:
    description:
      - C(scratch) writes the candidate into O(instances[].staging_dir) for the checks of the
        release (SGLang's parser, C(systemd-analyze)); nothing runs from there, so it always runs,
        in check mode too, and is never a change. An instance without keys has no scratch
        secrets file (an old one is removed). It also reads, for the checks, what each instance's
        C(current) link resolves to (RV(current)) and whether O(python) can run (RV(python)).
      - C(staged) keeps the candidate as a release directory and compares it with the live files.
      - C(active) installs the staged release (see the description).
      - C(prune) removes the old releases, their JIT caches and the unused L3 directories (see the description).
      - >-
        C(rollback_secrets), the role's C(rollback) before it restores a release: each instance's
        secrets file holds the keys of O(secrets) (the inventory now), never those of the release
        O(instances[].release_dir) it goes back to; an instance whose release and O(secrets) disagree
        on having keys at all is refused, for every instance before anything is written. The file is
        C(0600) root's when that release's unit loads it as a credential (C(LoadCredential=secrets.yaml:)),
        else (a release staged before credentials, whose SGLang opens the path as the service user)
        C(0640) with group O(service_group).
      - >-
        C(dropins) looks for systemd drop-ins (C(*.conf)) in each instance's O(instances[].dropin_dirs); the
        toolkit writes none, so every one found is foreign. Without O(remove) it fails naming each file
        and the fix, changing nothing; with O(remove) it deletes them (RV(removed); RV(instances) must
        restart, after a daemon-reload). Check mode deletes nothing.
    type: str
    choices: [scratch, staged, active, rollback_secrets, dropins, prune]
    default: staged
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
        description: The live unit file, compared with O(instances[].unit). Required unless O(state=prune).
        type: path
      env_path:
        description: The live environment file, compared with O(env). Required unless O(state=prune).
        type: path
      secrets_path:
        description: The live secrets file; an instance without keys must have none. Required unless O(state=prune).
        type: path
      dropin_dirs:
        description: With O(state=dropins), the drop-in directories of the instance's unit (absolute paths).
        type: list
        elements: path
      release_dir:
        description: The release directory to keep the candidate in (an absolute path). Required unless O(state=prune).
        type: path
      unit:
        description: The candidate unit file's content. Required unless O(state=prune).
        type: str
      argv_json:
        description:
          - >-
            The content of C(argv.json) (the launch argv; keys only in the secrets file).
            Required with O(state=staged).
        type: str
      release_json:
        description:
          - >-
            The content of C(release.json) (what the release is and what it runs from).
            Required with O(state=staged).
        type: str
      staging_dir:
        description:
          - >-
            The instance's scratch directory (root only).
            Required with O(state=scratch).
        type: path
      check_argv_json:
        description:
          - >-
            The content of the scratch C(argv.json) SGLang's parser reads (with the scratch secrets file).
            Required with O(state=scratch).
        type: str
      state_dir:
        description:
          - >-
            The instance's state directory (its C(current) and C(previous) pointers).
            Required with O(state=active) and O(state=prune).
        type: path
      releases_dir:
        description:
          - >-
            The instance's releases directory (an adopted unit is kept there; O(state=prune) prunes it).
            Required with O(state=active) and O(state=prune).
        type: path
      cache_root:
        description:
          - >-
            The directory of the instance's JIT caches, one C(<cache_root>/<release id>) per release.
            Required with O(state=prune).
        type: path
      l3:
        description:
          - >-
            With O(state=prune), the planned L3 tier of the instance (its C(dir) is kept); empty when the tier is off.
        type: dict
      unit_name:
        description:
          - >-
            The unit's name, e.g. C(sglang-main.service) (in an adopted release's record).
            Required with O(state=active).
        type: str
      bind:
        description:
          - >-
            The address the instance binds (in an adopted release's record).
            Required with O(state=active).
        type: str
      port:
        description:
          - >-
            The instance's port (in an adopted release's record).
            Required with O(state=active).
        type: int
  env:
    description:
      - Each instance's candidate environment file, by instance name (a missing name is an empty file).
      - It holds no keys (they are in the secrets file); like the unit, it is shown by C(--diff).
    type: dict
    default: {}
  secrets:
    description:
      - Each instance's candidate secrets file (SGLang's C(--config) YAML with its API keys), by
        instance name; empty or missing for an instance without keys.
    type: dict
    default: {}
  changing:
    description:
      - With O(state=active), the instances whose live files differ from the staged release (what
        O(state=staged) returned as RV(pending)); only their pointers move to C(previous).
    type: list
    elements: str
    default: []
  remove:
    description: With O(state=dropins), delete the foreign drop-ins instead of refusing them.
    type: bool
    default: false
  keep:
    description: With O(state=prune), the release directories kept per instance besides the protected ones (the newest).
    type: int
  protect:
    description:
      - >-
        With O(state=prune), release ids (config hashes, or their first 12 characters: the directory's name)
        that are never removed, besides those the C(current) and C(previous) pointers name.
    type: list
    elements: str
    default: []
  l3_dir:
    description: With O(state=prune), the L3 tier's directory (C(<l3_dir>/<name>/<identity id>)).
    type: path
  python:
    description: With O(state=scratch), the interpreter the checks will run (RV(python) says whether it can).
    type: path
  service_group:
    description:
      - >-
        With O(state=rollback_secrets), the group of a secrets file restored for a release staged before
        systemd credentials (its unit has no C(LoadCredential=secrets.yaml:) line and SGLang reads the
        file as the service user). O(state=active) writes every secrets file root's alone.
    type: str
    default: root
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

- name: Prune | old releases, their JIT caches and the L3 directories no kept release uses
  sglang_service_release:
    state: prune
    instances:
      - name: main
        state_dir: /var/lib/sglang/main
        releases_dir: /var/lib/sglang/main/releases
        cache_root: /var/lib/sglang/main/cache
        l3: {}
    keep: 5
    protect: [0123456789ab]
    l3_dir: /var/lib/sglang/l3
  register: pruned

- name: Install | the staged release becomes the live one
  sglang_service_release:
    state: active
    instances:
      - name: main
        unit_path: /etc/systemd/system/sglang-main.service
        env_path: /etc/sglang/main.env
        secrets_path: /etc/sglang/main.secrets.yaml
        release_dir: /var/lib/sglang/main/releases/0123456789ab
        state_dir: /var/lib/sglang/main
        releases_dir: /var/lib/sglang/main/releases
        unit_name: sglang-main.service
        bind: 127.0.0.1
        port: 30000
        unit: "{{ unit_text }}"
    env: {main: "{{ env_text }}"}
    changing: "{{ staged.pending }}"
  register: installed
"""

RETURN = r"""
pending:
  description: Names of the instances whose live unit, env or secrets file differs from the candidate.
  returned: with O(state=staged)
  type: list
  elements: str
  sample: [main]
restart:
  description: With O(state=active), the instances whose env, secrets or unit file changed (they restart).
  returned: with O(state=active)
  type: list
  elements: str
  sample: [main]
units_changed:
  description: With O(state=active), whether a unit file changed (systemd must reload its units).
  returned: with O(state=active)
  type: bool
  sample: true
kept:
  description: With O(state=rollback_secrets), the instances whose secrets file holds the keys of O(secrets).
  returned: with O(state=rollback_secrets)
  type: list
  elements: str
  sample: [main]
changed_paths:
  description:
    - With O(state=active) or O(state=rollback_secrets), the files and pointers written (in check mode, that would be).
  returned: with O(state=active) or O(state=rollback_secrets)
  type: list
  elements: str
  sample: [/etc/sglang/main.env, /var/lib/sglang/main/current]
instances:
  description: With O(state=dropins) and O(remove), the instances that had a foreign drop-in (they restart).
  returned: with O(state=dropins)
  type: list
  elements: str
  sample: [main]
removed:
  description:
    - With O(state=dropins) and O(remove), the drop-in files deleted (in check mode, that would be).
    - With O(state=prune), the release, JIT cache and L3 directories deleted (in check mode, that would be).
  returned: with O(state=dropins) or O(state=prune)
  type: list
  elements: str
  sample: [/etc/systemd/system/sglang-main.service.d/override.conf]
refused:
  description:
    - >-
      With O(state=prune), the directories left alone because, when their turn came, they were no longer
      a real directory in their parent (a symlink put there is neither followed nor removed).
  returned: with O(state=prune)
  type: list
  elements: str
  sample: []
kept_releases:
  description:
    - >-
      With O(state=prune), the parsed C(release.json) of every release kept (one that cannot be read is
      left out); the role publishes it as sglang_service_kept_releases.
  returned: with O(state=prune)
  type: list
  elements: dict
  sample: [{name: main, config_hash: 0123456789ab, venv: /opt/sglang/venvs/0.5.23, model_paths: [/srv/models/main]}]
current:
  description:
    - >-
      With O(state=scratch), per instance the real path its C(<state_dir>/current) link resolves to, or
      an empty string when it has none (the release it runs now).
  returned: with O(state=scratch)
  type: dict
  sample: {main: /var/lib/sglang/main/releases/0123456789ab}
python:
  description: With O(state=scratch) and O(python), C(path), C(exists) and C(executable) (symlinks followed).
  returned: with O(state=scratch) and O(python)
  type: dict
  sample: {path: /opt/sglang/current/bin/python, exists: true, executable: true}
written:
  description:
    - The release directory and files created or rewritten (in check mode, that would be).
    - With O(state=scratch), the scratch files rewritten (never a change).
  returned: with O(state=staged) or O(state=scratch)
  type: list
  elements: str
  sample: [/var/lib/sglang/main/releases/0123456789ab, /var/lib/sglang/main/releases/0123456789ab/unit]
"""

import grp
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_service_release import (
    DropinsRefused,
    PruneRefused,
    RollbackRefused,
    activate,
    current_releases,
    dropins,
    interpreter,
    prune,
    rollback_secrets,
    scratch,
    stage,
)

INSTANCE_OPTIONS = {
    "name": {"type": "str", "required": True},
    "unit_path": {"type": "path"},
    "env_path": {"type": "path"},
    "secrets_path": {"type": "path"},
    "release_dir": {"type": "path"},
    "dropin_dirs": {"type": "list", "elements": "path"},
    "unit": {"type": "str"},
    "argv_json": {"type": "str"},
    "release_json": {"type": "str"},
    "state_dir": {"type": "path"},
    "releases_dir": {"type": "path"},
    "staging_dir": {"type": "path"},
    "check_argv_json": {"type": "str"},
    "unit_name": {"type": "str"},
    "bind": {"type": "str"},
    "port": {"type": "int"},
    "cache_root": {"type": "path"},
    "l3": {"type": "dict"},
}
# Every state but prune works on an instance's live files and its candidate release.
LIVE = ("unit_path", "env_path", "secrets_path", "release_dir", "unit")
NEEDED = {
    "scratch": (*LIVE, "staging_dir", "check_argv_json", "unit_name", "state_dir"),
    "staged": (*LIVE, "argv_json", "release_json"),
    "active": (*LIVE, "state_dir", "releases_dir", "unit_name", "bind", "port"),
    "rollback_secrets": LIVE,
    "dropins": (*LIVE, "dropin_dirs"),
    "prune": ("state_dir", "releases_dir", "cache_root"),
}


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["scratch", "staged", "active", "rollback_secrets", "dropins", "prune"],
                      "default": "staged"},
            "instances": {"type": "list", "elements": "dict", "required": True, "options": INSTANCE_OPTIONS},
            # The env file holds no keys (they are in the secrets file): shown in --diff like the unit.
            "env": {"type": "dict", "default": {}},
            "secrets": {"type": "dict", "default": {}, "no_log": True},
            "changing": {"type": "list", "elements": "str", "default": []},
            "service_group": {"type": "str", "default": "root"},
            "remove": {"type": "bool", "default": False},
            "keep": {"type": "int"},
            "protect": {"type": "list", "elements": "str", "default": []},
            "l3_dir": {"type": "path"},
            "python": {"type": "path"},
        },
        required_if=[("state", "prune", ("keep", "l3_dir"))],
        supports_check_mode=True,
    )
    state = module.params["state"]
    for instance in module.params["instances"]:
        missing = [key for key in NEEDED[state] if instance.get(key) is None]
        if missing:
            module.fail_json(msg=f"instance {instance['name']}: state={state} needs {', '.join(missing)}")
        for key in ("release_dir", "state_dir", "releases_dir", "staging_dir", "cache_root"):
            if instance.get(key) is not None and not instance[key].startswith("/"):
                module.fail_json(msg=f"instance {instance['name']}: {key} {instance[key]!r} is not an absolute path")
    # root:root when running as root (as the copy and file tasks this replaces required).
    owner = (0, 0) if os.geteuid() == 0 else None
    env, secrets = module.params["env"] or {}, module.params["secrets"] or {}
    gid = None
    if state == "rollback_secrets" and owner is not None:
        try:
            gid = grp.getgrnam(module.params["service_group"]).gr_gid
        except KeyError:
            module.fail_json(msg=f"service_group {module.params['service_group']!r} is not a group on this host "
                                 "(sglang_service_group: the service user's group, created by the role's user step)")
    try:
        if state == "prune":
            result = prune(module.params["instances"], module.params["keep"], module.params["protect"],
                           module.params["l3_dir"], module.check_mode, want_diff=module._diff)
            for path in result["refused"]:
                module.warn(f"prune left {path} alone: it is no longer a real directory where it was listed")
        elif state == "dropins":
            result = dropins(module.params["instances"], module.params["remove"], module.check_mode)
        elif state == "scratch":
            result = {"written": scratch(module.params["instances"], env, secrets, owner), "changed": False,
                      "current": current_releases(module.params["instances"])}
            if module.params["python"]:
                result["python"] = interpreter(module.params["python"])
        elif state == "rollback_secrets":
            result = rollback_secrets(module.params["instances"], secrets, module.check_mode, owner, gid)
        elif state == "staged":
            result = stage(module.params["instances"], env, secrets, module.check_mode, owner)
        else:
            result = activate(module.params["instances"], env, secrets, module.params["changing"], module.check_mode,
                              owner, want_diff=module._diff)
            if not module._diff:
                result.pop("diff")
    except (RollbackRefused, DropinsRefused, PruneRefused) as exc:
        module.fail_json(msg=str(exc))
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"the release ({state}) failed: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
