"""The controller's fingerprint of a host's desired release (roles/rollout/tasks/converged.yml).

site.yml lets a host skip its phases when the host's record (library/fleet_release_state) holds
the same fingerprint and its drift check passes. The fingerprint is a SHA-256 over what decides
the release, read on the controller without touching the host:
- the host's values of every option the roles declare (roles/*/meta/argument_specs.yml), as the
  inventory and extra vars set them (templated; a value that cannot be templated before facts are
  gathered counts by its raw text);
- the content of every controller file such a value names by an absolute path (model manifests,
  lock files, CA bundles): editing a manifest in place changes the release;
- the toolkit itself: every file of site.yml, ansible.cfg, playbooks/, roles/, library/,
  module_utils/ and callback_plugins/ but documentation (*.md) and byte code, so that a new
  version of a role walks every host through its phases once.
It is never stored in plain: the module keeps an HMAC of it under a key that lives on the host.

Beside it, one fingerprint per install phase (rollout_phase_fingerprints: rocm, venv, models, in
site.yml's order), so that a run whose change is only in a later phase (the service's config, a
model revision) leaves the earlier phases out on a host whose record still holds them. A phase's
fingerprint covers, the same way: the value of every role option whose name the phase's roles or
its playbook mention (its own role's options, and those of other roles it reads), the files such a
value names, the files of its roles and every file of the toolkit outside roles/ (site.yml,
ansible.cfg, playbooks/, library/, module_utils/, callback_plugins/), and the fingerprint of the
phase before it: a change in ROCm runs the venv and models phases again too.

A phase may read only a part of an option that belongs to a later phase: the ROCm phase's GPU check
reads, of the service's environment and instances, only what makes GPUs visible (the device masks,
each instance's name and TP size). For such options the phase's fingerprint covers that part only
(PHASE_VIEWS), so a change of the service's environment leaves the install phases out.

No secret enters a fingerprint: the fingerprints are set as facts (printed at -v), and a plain hash
over options that include a key would let anyone holding the output test a guessed key offline.
The values of the options the roles declare no_log, the keys of a mapping named api_key,
admin_api_key, token or password, and the user:password of a URL (a mirror or index with
credentials) read as "(set)"/"(credentials)" in the fingerprint; their real values are returned
apart by rollout_release_secrets, which goes to the host's module as a no_log option and is stored
only inside the HMAC under the host's key (library/fleet_release_state.py): a key rotation still
changes the record, and nothing printed on the controller depends on a key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

# What the site's phases read: the roles whose options make up a host's release.
ROLES = ("preflight", "rocm", "sglang_venv", "models", "sglang_service", "rollout", "rollout_gate", "rollout_router")
# Options that describe the run, not the release (set per run or per play, or switch the fast path).
NOT_RELEASE = frozenset({
    "rollout_canary", "rollout_fast_path", "rollout_report_dir", "rollout_report_note", "rollout_lock_break",
    "rollout_lock_stale_after_s", "rollout_lock_controller_path", "rollout_router_drain_grace_s",
    "rollout_router_wait_s",
    # Inputs of one call of an entry point (roles/rollout_router leave, join; roles/sglang_service
    # snapshot, restore, ab, probe_progress), not settings of a host.
    "rollout_router_leaving", "rollout_router_names",
    "sglang_service_snapshot_instance", "sglang_service_snapshot", "sglang_service_snapshot_running_hash",
    "sglang_service_ab_instance", "sglang_service_ab_probe", "sglang_service_probe_progress",
})
TREE = ("site.yml", "ansible.cfg", "playbooks", "roles", "library", "module_utils", "callback_plugins")
# The install phases a run can leave out, in site.yml's order: the files whose content counts (its
# role, its playbook; library/ and module_utils/, where its free-disk check is, are in SHARED_TREE)
# and those whose option names count (the same files).
PHASES = (
    ("rocm", ("roles/rocm", "playbooks/rocm.yml"), ("roles/rocm", "playbooks/rocm.yml")),
    ("venv", ("roles/sglang_venv", "playbooks/venv.yml"), ("roles/sglang_venv", "playbooks/venv.yml")),
    ("models", ("roles/models", "playbooks/models.yml"), ("roles/models", "playbooks/models.yml")),
)
SHARED_TREE = tuple(top for top in TREE if top != "roles")
# The environment variables that decide which GPUs a process sees: the ones the ROCm role's GPU check
# maps or refuses (roles/rocm/filter_plugins/rocm.py, rocm_gpu_map; tests/rollout compares the two).
GPU_VISIBILITY_KEYS = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
MAX_FILE_BYTES = 64 * 1024 * 1024

# Keys of a mapping whose value is a credential, wherever they occur (an instance's api_key...).
SECRET_FIELDS = frozenset({"api_key", "admin_api_key", "token", "password", "hf_token"})
# A URL's user:password@ (or token@).
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/@\s]+)@")
SET = "(set)"

_tree_digests: dict[str, str] = {}
_options: dict[str, tuple[str, ...]] = {}
_secret_options: dict[str, tuple[str, ...]] = {}


def _set_facts(node: Any, found: set[str]) -> None:
    """The names set_fact tasks set anywhere in a parsed task file (blocks included)."""
    if isinstance(node, list):
        for item in node:
            _set_facts(item, found)
    elif isinstance(node, Mapping):
        for key, value in node.items():
            if key in ("ansible.builtin.set_fact", "set_fact") and isinstance(value, Mapping):
                found.update(name for name in value if name != "cacheable")
            elif key in ("block", "rescue", "always"):
                _set_facts(value, found)


def _role_options(root: str) -> tuple[str, ...]:
    """The roles' option names, less those the run itself sets (set_fact outranks the inventory, and
    a fact cached from the last run, such as rocm_release, describes that run, not the desired one)."""
    if root not in _options:
        names: set[str] = set()
        secret: set[str] = set()
        outputs: set[str] = set()
        for role in ROLES:
            with open(os.path.join(root, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as spec:
                for entry in (yaml.safe_load(spec) or {}).get("argument_specs", {}).values():
                    options = (entry or {}).get("options") or {}
                    names.update(options)
                    secret.update(name for name, spec in options.items() if (spec or {}).get("no_log"))
            tasks = os.path.join(root, "roles", role, "tasks")
            for name in sorted(os.listdir(tasks)):
                with open(os.path.join(tasks, name), encoding="utf-8") as handle:
                    _set_facts(yaml.safe_load(handle), outputs)
        _options[root] = tuple(sorted(names - outputs - NOT_RELEASE))
        _secret_options[root] = tuple(sorted(secret))
    return _options[root]


def _public(value: Any, where: str, secrets: dict[str, Any], whole: bool = False) -> Any:
    """value with every secret in it replaced (see the module docstring); the secrets go into
    secrets by where they were found. whole: the value itself is a secret (a no_log option)."""
    if whole:
        if value in (None, "", [], {}):
            return value
        secrets[where] = value
        return SET
    if isinstance(value, Mapping):
        return {key: _public(item, f"{where}.{key}", secrets, str(key) in SECRET_FIELDS)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_public(item, f"{where}[{index}]", secrets) for index, item in enumerate(value)]
    if isinstance(value, str) and "@" in value:
        found = _URL_USERINFO.findall(value)
        if found:
            secrets[where] = [userinfo for _scheme, userinfo in found]
            return _URL_USERINFO.sub(lambda m: f"{m.group(1)}(credentials)@", value)
    return value


def _split(values: Mapping[str, Any], secret_options: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """({option: value without secrets}, {option: {where: secret}}) of the inputs."""
    public: dict[str, Any] = {}
    secrets: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        found: dict[str, Any] = {}
        public[name] = _public(value, name, found, name in secret_options)
        if found:
            secrets[name] = found
    return public, secrets


def _toolkit_files(root: str, tops: tuple[str, ...]) -> list[str]:
    """The toolkit's files under tops (files or folders below root), documentation and byte code
    left out, in a stable order."""
    files: list[str] = []
    for top in tops:
        path = os.path.join(root, top)
        if os.path.isfile(path):
            files.append(path)
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [os.path.join(folder, n) for n in sorted(names) if not n.endswith((".md", ".pyc"))]
    return files


def _tree_digest(root: str, tops: tuple[str, ...] = TREE) -> str:
    """SHA-256 over the toolkit's files under tops (path and content), in a stable order."""
    if (root, tops) not in _tree_digests:
        digest = hashlib.sha256()
        for name in _toolkit_files(root, tops):
            digest.update(os.path.relpath(name, root).encode() + b"\0")
            with open(name, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
        _tree_digests[(root, tops)] = digest.hexdigest()
    return _tree_digests[(root, tops)]


def _mentioned(root: str, tops: tuple[str, ...], names: tuple[str, ...]) -> list[str]:
    """The option names that occur as words in the files under tops (a phase's roles and playbook)."""
    words: set[str] = set()
    for name in _toolkit_files(root, tops):
        with open(name, encoding="utf-8", errors="replace") as handle:
            words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", handle.read()))
    return sorted(name for name in names if name in words)


def _gpu_environment(value: Any) -> Any:
    """Of an environment mapping, the GPU-visibility variables only; anything else as it is."""
    if not isinstance(value, Mapping):
        return value
    return {key: value[key] for key in sorted(value) if key in GPU_VISIBILITY_KEYS}


def _gpu_instances(value: Any) -> Any:
    """Of a list of instances, what the GPU check reads of each: its name, its GPU-visibility
    variables and its TP size (tp_size, or --tp-size in its args); anything else as it is."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, Mapping) for item in value):
        return value
    return [{"name": item.get("name"), "environment": _gpu_environment(item.get("environment") or {}),
             "tp_size": item.get("tp_size"), "--tp-size": (item.get("args") or {}).get("--tp-size")}
            for item in value]


# {phase: {option: the part of its value the phase reads}} (see the module docstring). A value that
# could not be templated counts whole, by its raw text.
PHASE_VIEWS = {
    "rocm": {
        "sglang_service_environment": _gpu_environment,
        "rocm_gpu_environment": _gpu_environment,
        "sglang_service_instances": _gpu_instances,
        "rocm_gpu_instances": _gpu_instances,
    },
}


def _phases(root: str, options: tuple[str, ...]) -> list[dict[str, Any]]:
    phases = []
    for name, files, scanned in PHASES:
        phases.append({"name": name, "options": _mentioned(root, scanned, options),
                       "digest": _tree_digest(root, SHARED_TREE + files)})
    return phases


def _named_files(value: Any, found: dict[str, str]) -> None:
    """Content digests of the controller files that a value names by an absolute path."""
    if isinstance(value, Mapping):
        for item in value.values():
            _named_files(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _named_files(item, found)
    elif isinstance(value, str) and value.startswith("/") and "\n" not in value and value not in found:
        try:
            if os.path.isfile(value) and os.path.getsize(value) <= MAX_FILE_BYTES:
                with open(value, "rb") as handle:
                    found[value] = hashlib.sha256(handle.read()).hexdigest()
        except OSError:
            found[value] = "unreadable"


def rollout_release_toolkit(root: str) -> dict[str, Any]:
    """What every host's fingerprint shares, computed once per run (run_once in tasks/converged.yml):
    the roles' option names and the digest of the toolkit's files under root."""
    options = _role_options(root)
    return {"options": list(options), "secret_options": list(_secret_options[root]),
            "digest": _tree_digest(root), "phases": _phases(root, options)}


def rollout_release_fingerprint(host_vars: Mapping[str, Any], raw_vars: Mapping[str, Any],
                                toolkit: Mapping[str, Any]) -> str:
    """The fingerprint of a host's desired release (see the module docstring).

    host_vars: hostvars[inventory_hostname] (templated on access); raw_vars: hostvars.raw_get(...)
    for the values that cannot be templated yet; toolkit: rollout_release_toolkit(project root)."""
    public, _secrets = _split(_inputs(host_vars, raw_vars, toolkit["options"]), toolkit.get("secret_options", ()))
    return _digest(public, toolkit["digest"])


def rollout_phase_fingerprints(host_vars: Mapping[str, Any], raw_vars: Mapping[str, Any],
                               toolkit: Mapping[str, Any]) -> dict[str, str]:
    """{phase: fingerprint} for the install phases (see the module docstring), each chained to the one
    before it. Arguments as for rollout_release_fingerprint."""
    raw: set[str] = set()
    values, _secrets = _split(_inputs(host_vars, raw_vars, toolkit["options"], raw), toolkit.get("secret_options", ()))
    result: dict[str, str] = {}
    before = ""
    for phase in toolkit["phases"]:
        views = PHASE_VIEWS.get(phase["name"], {})
        mine = {name: values[name] if name in raw or name not in views else views[name](values[name])
                for name in phase["options"] if name in values}
        before = _digest(mine, phase["digest"], before)
        result[phase["name"]] = before
    return result


def rollout_release_secrets(host_vars: Mapping[str, Any], raw_vars: Mapping[str, Any],
                            toolkit: Mapping[str, Any]) -> dict[str, Any]:
    """The secrets the fingerprints leave out, for the host's module only (its no_log option
    `secrets`, never a fact): {"release": text, "phases": {phase: text}}, each text the canonical
    JSON of the secrets that fingerprint covers ("" when none). A phase's text covers the secrets of
    its options (an option the phase reads only a view of counts by that view, which holds none) and
    the text of the phase before it. Arguments as for rollout_release_fingerprint."""
    raw: set[str] = set()
    _public_values, secrets = _split(_inputs(host_vars, raw_vars, toolkit["options"], raw),
                                     toolkit.get("secret_options", ()))

    def text(found: Mapping[str, Any], before: str = "") -> str:
        if not found and not before:
            return ""
        return json.dumps({"secrets": found, "before": before}, sort_keys=True, default=str)

    phases: dict[str, str] = {}
    before = ""
    for phase in toolkit["phases"]:
        views = PHASE_VIEWS.get(phase["name"], {})
        mine = {name: secrets[name] for name in phase["options"]
                if name in secrets and (name in raw or name not in views)}
        before = text(mine, before)
        phases[phase["name"]] = before
    return {"release": text(secrets), "phases": phases}


def _inputs(host_vars: Mapping[str, Any], raw_vars: Mapping[str, Any], names: Any,
            raw: set[str] | None = None) -> dict[str, Any]:
    """{name: templated value} of the options the host sets; a value that cannot be templated counts
    by its raw text, and its name goes into raw (when given)."""
    inputs: dict[str, Any] = {}
    for name in names:
        if name not in raw_vars:
            continue
        try:
            value = host_vars[name]
            json.dumps(value, sort_keys=True, default=str)
        except Exception:  # whatever templating raises, the raw text still decides
            value = {"raw": str(raw_vars[name])}
            if raw is not None:
                raw.add(name)
        inputs[name] = value
    return inputs


def _digest(inputs: dict[str, Any], toolkit_digest: str, before: str | None = None) -> str:
    files: dict[str, str] = {}
    _named_files(inputs, files)
    material: dict[str, Any] = {"options": inputs, "files": files, "toolkit": toolkit_digest}
    if before is not None:
        material["before"] = before
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def rollout_phase_outputs(host_vars: Mapping[str, Any], outputs: Mapping[str, list[str]]) -> dict[str, dict[str, Any]]:
    """{phase: {fact: value}} for each phase of outputs ({phase: [fact names]}) whose facts host_vars
    all hold now; a phase missing one is left out (the next run then runs it)."""
    found: dict[str, dict[str, Any]] = {}
    for phase, names in outputs.items():
        try:
            facts = json.loads(json.dumps({name: host_vars[name] for name in names}, default=str))
        except Exception:  # undefined or not templatable (whatever templating raises): the phase runs next time
            facts = None
        if facts is not None:
            found[phase] = facts
    return found


def rollout_converged_summary(hosts: list[str], results: Mapping[str, Any], tags_given: bool,
                              playbook: str = "site.yml") -> dict[str, Any]:
    """What the fast path decided for each host of the converged play, from the drift checks'
    registered results (results: {host: _rollout_converged}; a host whose check was skipped has a
    skipped result or none): {"groups": {host: [group, ...]}, the groups it joins (_converged, or
    _current_<phase> per install phase its record still holds); "lines": [one sentence per host]}.
    tags_given: the run has --tags or --skip-tags (the fast path is off). playbook: the playbook that
    checked (site.yml, or rollout.yml run alone, which has no install phase: a host that is not
    converged goes through its rollout, the only phase it has)."""
    groups: dict[str, list[str]] = {}
    lines: list[str] = []
    for host in hosts:
        result = results.get(host) or {}
        if result.get("unreachable"):
            lines.append(f"{host}: unreachable: {result.get('msg', '')}")
        elif result.get("skipped") or "converged" not in result:
            why = ("--tags or --skip-tags given" if tags_given
                   else "rollout_fast_path is false or rollout_probe_always is true for this host")
            lines.append(f"{host}: the fast path is off ({why})")
        elif result["converged"]:
            groups[host] = ["_converged"]
            lines.append(f"{host}: converged: its recorded release is the desired one and nothing drifted; "
                         "every phase is skipped")
        else:
            current = list(result.get("current_phases") or [])
            if current:
                groups[host] = [f"_current_{phase}" for phase in current]
            if playbook == "rollout.yml":
                runs = "goes through the rollout (rollout.yml alone)"
            elif current:
                runs = f"runs every phase but {', '.join(current)} (current)"
            else:
                runs = "runs every phase"
            lines.append(f"{host}: {runs}: {'; '.join(result.get('reasons') or [])}")
    return {"groups": groups, "lines": lines}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "rollout_release_toolkit": rollout_release_toolkit,
            "rollout_release_fingerprint": rollout_release_fingerprint,
            "rollout_phase_fingerprints": rollout_phase_fingerprints,
            "rollout_release_secrets": rollout_release_secrets,
            "rollout_phase_outputs": rollout_phase_outputs,
            "rollout_converged_summary": rollout_converged_summary,
        }
