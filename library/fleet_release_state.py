#!/usr/bin/python
# hicache-fleet: the record of what a host converged to, and the cheap drift check against it.
# Runs on the managed host with its system Python: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_release_state
short_description: Record what a host converged to and check cheaply that it still holds
description:
  - >-
    Lets a host that is already converged skip the rollout's phases. After a successful whole run
    the playbook records on the host what it converged to (O(state=record)); on the next run one
    call (O(state=check)) says whether that record still holds, and if not, why.
  - >-
    The record is a JSON file at O(path) with an HMAC-SHA256 of the controller's digest of the
    desired release (O(fingerprint)), an HMAC-SHA256 of the content of every file matched by
    O(files), the size of every regular file under each of O(trees), and the O(units) that were
    active. Neither the fingerprint nor a plain digest of a file is stored (some of these files
    hold API keys): the HMAC key is a file beside the record, C(<dirname of path>/.converged-key),
    32 random bytes in hex, mode C(0600), created by O(state=record) when missing.
  - >-
    O(state=check) is read-only and never changed. It stops at the first of: no record, a record
    or key that cannot be read, a different O(fingerprint); otherwise it checks every recorded file
    (missing, changed, or a new file matching a recorded glob), every recorded tree file (missing or
    changed size; files added to a tree are not drift) and every recorded unit (not active).
  - >-
    It is cheap: files under O(trees) are only stat-ed, never read; only the O(files) are hashed.
  - >-
    O(state=record) writes the record atomically (a temporary file in the same directory, then a
    rename), mode C(0600), creating its directory (mode C(0755)) when missing. The content is
    deterministic (sorted keys, no timestamps), so recording the same state again is not a change.
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
options:
  state:
    description:
      - C(check) compares the host with the record and returns RV(converged) and RV(reasons).
      - C(record) writes what the host is now as the record.
    type: str
    choices: [check, record]
    default: check
  path:
    description:
      - The record file on the managed host (an absolute path).
      - The HMAC key is C(.converged-key) in the same directory.
    type: path
    default: /var/lib/hicache-fleet/converged.json
  fingerprint:
    description:
      - The controller's digest of the desired release (roles, variables, versions), any string.
      - Stored only as an HMAC-SHA256 under the host's key; when it differs from the recorded one,
        O(state=check) reports that the desired release changed and checks nothing else.
    type: str
    required: true
  secrets:
    description:
      - >-
        What the controller's digests leave out because it is secret (api keys, tokens, a URL's
        credentials): C(release), a string that goes with O(fingerprint), and C(phases), a string by
        phase name that goes with that phase's digest in O(phases). Each is HMACed together with its
        digest under the host's key and never stored or returned otherwise, so a key rotation changes
        the release while the digests the controller prints hold no key. Empty or missing: the
        digest alone (records written before this option stay valid).
    type: dict
    default: {}
  files:
    description:
      - >-
        Absolute glob patterns (C(**) matches across directories) of files whose content must not
        change, such as unit files and configuration. On O(state=record) each glob is expanded
        (sorted) and every matched regular file (a symlink counts by its target) is stored with an
        HMAC-SHA256 of its bytes. The record file and its key file are never included.
      - O(state=check) reads the globs from the record, see RV(reasons).
      - >-
        When given to O(state=check) it must be the list that was recorded (in any order), else the
        host is not converged.
    type: list
    elements: path
    default: []
  absent:
    description:
      - >-
        Absolute glob patterns of files that must not exist, such as systemd drop-ins the toolkit never
        writes (C(/etc/systemd/system/sglang-*.service.d/*.conf)). O(state=check) expands them on every
        call (they are not recorded) and gives one reason per match, naming it; O(state=record) ignores them.
    type: list
    elements: path
    default: []
  trees:
    description:
      - >-
        Absolute paths of directories (for example a model directory) or single files whose file
        sizes must not change. On O(state=record), for a directory (a symlinked top directory is
        followed, symlinks to directories below it are not) the size of every regular file under it
        is stored by relative path, a symlink to a file counting by its target's size; for a file,
        its size. A path that does not exist or a dangling symlink under it makes the record fail.
      - Files added to a tree later are not drift. The record file and its key file are never included.
      - With O(state=check), as for O(files).
    type: list
    elements: path
    default: []
  phases:
    description:
      - >-
        The controller's digest of each phase of the desired release (for example C(rocm), C(venv),
        C(models)), by phase name: what that phase reads, and the phases before it. Stored, like
        O(fingerprint), only as an HMAC-SHA256 under the host's key.
      - >-
        With O(state=check), a phase is current (RV(current_phases)) when its digest is the recorded
        one and nothing recorded drifted, even when O(fingerprint) differs: a run whose change
        touches a later phase (the service's config) can leave that phase's tasks out. When
        O(fingerprint) differs and O(phases) is given, the files, trees and units are checked.
    type: dict
    default: {}
  outputs:
    description:
      - >-
        With O(state=record): the facts each phase published in the recorded run, by phase name (a
        mapping of fact names to values; only phases also in O(phases)). Stored in plain in the record
        (mode C(0600)): paths and release ids, no keys. O(state=check) returns those of the current
        phases (RV(outputs)), for the run to publish in place of the phases it leaves out.
    type: dict
    default: {}
  units:
    description:
      - >-
        systemd units that must be active. O(state=record) fails, naming them, when any is not
        active (C(systemctl is-active)).
      - >-
        When given to O(state=check) it must be the list that was recorded (in any order), else the
        host is not converged.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    description:
      - O(state=check) reads only and runs the same in check mode.
      - O(state=record) writes nothing in check mode and returns C(changed) as it would be.
    support: full
  diff_mode:
    description: The record holds digests, nothing worth showing as a diff.
    support: none
  platform:
    description: Any POSIX host; O(units) need systemd (C(systemctl)).
    support: full
    platforms: posix
notes:
  - Needs only the Python standard library on the managed host.
  - >-
    Units are queried with one C(systemctl is-active UNIT...) call; when C(systemctl) is not found,
    every unit counts as not active.
  - >-
    The fingerprint is the controller's to compute; when it covers everything the rollout would
    change, a converged host with an unchanged fingerprint and no drift can skip the rollout.
"""

EXAMPLES = r"""
- name: Is this host still what the last whole run left it?
  fleet_release_state:
    state: check
    fingerprint: "{{ fleet_release_fingerprint }}"
  register: release_state

- name: Say why the host needs the rollout's phases
  ansible.builtin.debug:
    msg: "{{ release_state.reasons | join('; ') }}"
  when: not release_state.converged

- name: After a successful whole run, record what the host converged to
  fleet_release_state:
    state: record
    fingerprint: "{{ fleet_release_fingerprint }}"
    files:
      - /etc/systemd/system/sglang@*.service
      - /etc/hicache-fleet/*.env
    trees:
      - /srv/models/seed-27b
    units:
      - sglang@seed-27b.service
"""

RETURN = r"""
msg:
  description: One-line summary.
  returned: always
  type: str
  sample: "not converged: /etc/systemd/system/sglang@a.service was changed since the last whole run"
path:
  description: The record file.
  returned: always
  type: str
  sample: /var/lib/hicache-fleet/converged.json
key_path:
  description: The HMAC key file beside the record.
  returned: always
  type: str
  sample: /var/lib/hicache-fleet/.converged-key
converged:
  description: True when the record exists and still holds (no reasons).
  returned: when state is check
  type: bool
  sample: false
current_phases:
  description: >-
    The phases of O(phases) whose recorded digest is the one given, on a host where nothing recorded
    drifted (all of them when RV(converged)); empty when the record is missing, unreadable or older
    than phases, or when anything drifted.
  returned: when state is check
  type: list
  elements: str
  sample: [rocm, venv, models]
outputs:
  description: The facts the current phases published in the recorded run, by phase (see O(outputs)).
  returned: when state is check
  type: dict
  sample: {models: {models_main_path: /srv/models/seed-27b/1a2b3c}}
reasons:
  description: Why the host is not converged, one sentence each naming the path or unit; empty when converged.
  returned: when state is check
  type: list
  elements: str
  sample:
    - /srv/models/seed-27b/model-00001-of-00002.safetensors is missing
    - sglang@a.service is not active (failed)
recorded:
  description: What the record covers.
  returned: when state is record
  type: dict
  contains:
    files: {description: files stored with their HMAC (over all globs), type: int}
    globs: {description: globs of O(files), type: int}
    trees: {description: trees stored, type: int}
    tree_files: {description: files whose size is stored (over all trees), type: int}
    units: {description: units stored, type: int}
    phases: {description: phases stored, type: int}
  sample: {files: 3, globs: 2, trees: 1, tree_files: 14, units: 1, phases: 3}
"""

import glob
import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule

RECORD_VERSION = 1
KEY_NAME = ".converged-key"
CHUNK = 1024 * 1024


class StateError(Exception):
    """A failure told as a sentence."""


def key_path_of(path):
    return os.path.join(os.path.dirname(path), KEY_NAME)


def hmac_hex(key, data):
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def file_hmac(key, path):
    mac = hmac.new(key, digestmod=hashlib.sha256)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            mac.update(chunk)
    return mac.hexdigest()


def read_key(key_path):
    """The key bytes, or None when the file does not exist. StateError when unreadable or invalid."""
    try:
        with open(key_path, encoding="ascii") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise StateError(f"the key of the converged record ({key_path}) cannot be read: {exc}") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise StateError(f"the key of the converged record ({key_path}) is not 32 bytes in hex")
    return key


def excluded(path, skip):
    return os.path.realpath(path) in skip


def glob_matches(pattern, skip):
    """Regular files (symlinks by their target) matching the glob, sorted, without the record's own files."""
    return [m for m in sorted(glob.glob(pattern, recursive=True)) if os.path.isfile(m) and not excluded(m, skip)]


def tree_sizes(top, skip):
    """{relative path: size} of the regular files under a directory, or the size of a file."""
    try:
        st = os.stat(top)
    except FileNotFoundError:
        raise StateError(f"cannot record tree {top}: it does not exist") from None
    except OSError as exc:
        raise StateError(f"cannot record tree {top}: {exc}") from None
    if stat.S_ISREG(st.st_mode):
        return st.st_size
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(f"cannot record tree {top}: it is neither a directory nor a regular file")
    errors = []
    sizes = {}
    for dirpath, _dirnames, filenames in os.walk(top, onerror=errors.append, followlinks=False):
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                fst = os.stat(full)
            except FileNotFoundError:
                if os.path.islink(full):
                    raise StateError(f"cannot record tree {top}: {full} is a dangling symlink") from None
                continue  # removed while walking
            except OSError as exc:
                raise StateError(f"cannot record tree {top}: {exc}") from None
            if stat.S_ISREG(fst.st_mode) and not excluded(full, skip):
                sizes[os.path.relpath(full, top)] = fst.st_size
    if errors:
        raise StateError(f"cannot record tree {top}: {errors[0]}")
    return sizes


def unit_states(module, units):
    """{unit: state} from one `systemctl is-active` call; a note instead of a state when it gives none."""
    if not units:
        return {}
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return {u: "systemctl is missing on this host" for u in units}
    # rc is non-zero when any unit is not active: the states on stdout are the answer either way.
    rc, out, err = module.run_command([systemctl, "is-active", *units])
    lines = out.splitlines()
    if len(lines) != len(units):
        note = (err or out).strip().replace("\n", " ") or f"rc {rc}"
        why = f"systemctl is-active gave {len(lines)} states for {len(units)} units: {note}"
        return {u: why for u in units}
    return {u: lines[i].strip() or "no state" for i, u in enumerate(units)}


def unique(items):
    return sorted(set(items))


def material(digest, secret):
    """The bytes HMACed for a digest: the digest, and the secrets that go with it when there are any."""
    if not secret:
        return digest.encode("utf-8")
    return (digest + "\0" + str(secret)).encode("utf-8")


def release_secret(params):
    return (params.get("secrets") or {}).get("release") or ""


def phase_secret(params, name):
    return ((params.get("secrets") or {}).get("phases") or {}).get(name) or ""


def validate(params):
    errors = []
    if not params["path"] or not os.path.isabs(params["path"]):
        errors.append(f"path must be an absolute path, not {params['path']!r}.")
    if not params["fingerprint"]:
        errors.append("fingerprint must not be empty.")
    for opt in ("files", "trees", "absent"):
        for item in params[opt]:
            if not os.path.isabs(item):
                errors.append(f"{opt} must be absolute paths, not {item!r}.")
    for unit in params["units"]:
        if not unit or unit.startswith("-") or any(c.isspace() for c in unit):
            errors.append(f"units must be unit names, not {unit!r}.")
    for name, digest in params["phases"].items():
        if not isinstance(digest, str) or not digest:
            errors.append(f"phases must map phase names to non-empty digests, not {name!r}: {digest!r}.")
    for name, facts in params["outputs"].items():
        if name not in params["phases"]:
            errors.append(f"outputs names phase {name!r}, which phases does not give.")
        elif not isinstance(facts, dict):
            errors.append(f"outputs[{name!r}] must be a mapping of fact names to values.")
    return errors


# ---------------------------------------------------------------------------------------------- record


def build_record(module, params, key, skip):
    units = unique(params["units"])
    states = unit_states(module, units)
    inactive = [f"{u} ({s})" for u, s in states.items() if s != "active"]
    if inactive:
        raise StateError("cannot record a converged state while units are not active: " + ", ".join(inactive))
    files = {}
    for pattern in params["files"]:
        entry = {}
        for match in glob_matches(pattern, skip):
            try:
                entry[match] = file_hmac(key, match)
            except OSError as exc:
                raise StateError(f"cannot record {match}: {exc}") from None
        files[pattern] = entry
    trees = {top: tree_sizes(top, skip) for top in params["trees"]}
    rec = {
        "version": RECORD_VERSION,
        "fingerprint_hmac": hmac_hex(key, material(params["fingerprint"], release_secret(params))),
        "files": files,
        "trees": trees,
        "units": units,
    }
    if params["phases"]:
        rec["phases"] = {name: hmac_hex(key, material(digest, phase_secret(params, name)))
                         for name, digest in params["phases"].items()}
        rec["outputs"] = {name: facts for name, facts in params["outputs"].items() if name in params["phases"]}
    return rec


def write_atomic(path, data):
    """Write bytes to path through a temporary file in the same directory, mode 0600."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def mode_of(path):
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None


def record(module, params):
    path = params["path"]
    key_path = key_path_of(path)
    directory = os.path.dirname(path)
    key = read_key_for_record(key_path)
    new_key = key is None
    if new_key:
        key = secrets.token_bytes(32)
    skip = {os.path.realpath(path), os.path.realpath(key_path)}
    rec = build_record(module, params, key, skip)
    data = (json.dumps(rec, sort_keys=True, indent=2) + "\n").encode("utf-8")
    try:
        with open(path, "rb") as f:
            old = f.read()
    except FileNotFoundError:
        old = None
    except OSError as exc:
        raise StateError(f"cannot read the converged record at {path}: {exc}") from None
    content_changed = old != data
    key_mode_wrong = not new_key and mode_of(key_path) != 0o600
    record_mode_wrong = not content_changed and mode_of(path) != 0o600
    changed = new_key or content_changed or key_mode_wrong or record_mode_wrong
    if changed and not module.check_mode:
        try:
            if not os.path.isdir(directory):
                os.makedirs(directory, mode=0o755)
                os.chmod(directory, 0o755)  # noqa: S103  # the state directory is world-readable, its files are not
            if new_key:
                write_atomic(key_path, key.hex().encode("ascii") + b"\n")
            elif key_mode_wrong:
                os.chmod(key_path, 0o600)
            if content_changed:
                write_atomic(path, data)
            elif record_mode_wrong:
                os.chmod(path, 0o600)
        except OSError as exc:
            raise StateError(f"cannot write the converged record at {path}: {exc}") from None
    summary = {
        "globs": len(rec["files"]),
        "files": sum(len(v) for v in rec["files"].values()),
        "trees": len(rec["trees"]),
        "tree_files": sum(len(v) if isinstance(v, dict) else 1 for v in rec["trees"].values()),
        "units": len(rec["units"]),
        "phases": len(rec.get("phases", {})),
    }
    verb = "would record" if module.check_mode else "recorded"
    if changed:
        msg = (f"{verb} the converged state at {path}: {summary['files']} files, {summary['tree_files']} files "
               f"in {summary['trees']} trees, {summary['units']} units")
    else:
        msg = f"the converged record at {path} is already up to date"
    return {"changed": changed, "msg": msg, "recorded": summary}


def read_key_for_record(key_path):
    """The existing key, or None (a new one is made) when it is missing or not a valid key."""
    try:
        return read_key(key_path)
    except StateError:
        if os.path.exists(key_path) and not os.access(key_path, os.R_OK):
            raise
        return None


# ----------------------------------------------------------------------------------------------- check


def load_record(path):
    """(record, None) or (None, reason)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None, (f"no converged record at {path}: the host has not completed a whole run with this "
                      "toolkit yet")
    except OSError as exc:
        return None, f"the converged record at {path} cannot be read: {exc}"
    try:
        rec = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"the converged record at {path} is corrupt (not JSON: {exc})"
    problem = record_problem(rec)
    if problem:
        return None, f"the converged record at {path} is corrupt ({problem})"
    return rec, None


def record_problem(rec):
    if not isinstance(rec, dict):
        return "not a JSON object"
    if rec.get("version") != RECORD_VERSION:
        return f"version {rec.get('version')!r}, this module reads version {RECORD_VERSION}"
    if not isinstance(rec.get("fingerprint_hmac"), str):
        return "no fingerprint_hmac"
    files = rec.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and all(isinstance(h, str) for h in v.values()) for v in files.values()
    ):
        return "files is not a map of globs to {path: hmac}"
    trees = rec.get("trees")
    if not isinstance(trees, dict) or not all(
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, dict) and all(isinstance(s, int) and not isinstance(s, bool) for s in v.values()))
        for v in trees.values()
    ):
        return "trees is not a map of paths to sizes"
    units = rec.get("units")
    if not isinstance(units, list) or not all(isinstance(u, str) for u in units):
        return "units is not a list of unit names"
    # Optional (records written without phases have neither).
    phases = rec.get("phases", {})
    if not isinstance(phases, dict) or not all(isinstance(h, str) for h in phases.values()):
        return "phases is not a map of phase names to HMACs"
    outputs = rec.get("outputs", {})
    if not isinstance(outputs, dict) or not all(isinstance(v, dict) for v in outputs.values()):
        return "outputs is not a map of phase names to facts"
    return None


def file_reasons(key, files, skip):
    reasons = []
    for pattern in sorted(files):
        recorded = files[pattern]
        for path in sorted(recorded):
            if not os.path.isfile(path):
                reasons.append(f"{path} is missing")
                continue
            try:
                digest = file_hmac(key, path)
            except OSError as exc:
                reasons.append(f"{path} cannot be read: {exc}")
                continue
            if not hmac.compare_digest(digest, recorded[path]):
                reasons.append(f"{path} was changed since the last whole run")
        for path in glob_matches(pattern, skip):
            if path not in recorded:
                reasons.append(f"{path} is new (matches {pattern})")
    return reasons


def size_reason(label, path, recorded):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{label} is missing"
    except OSError as exc:
        return f"{label} cannot be read: {exc}"
    if not stat.S_ISREG(st.st_mode):
        return f"{label} is no longer a regular file"
    if st.st_size != recorded:
        return f"{label} changed size ({recorded} -> {st.st_size} bytes)"
    return None


def tree_reasons(trees):
    reasons = []
    for top in sorted(trees):
        recorded = trees[top]
        if isinstance(recorded, int):
            reason = size_reason(top, top, recorded)
            if reason:
                reasons.append(reason)
            continue
        if not os.path.exists(top):
            reasons.append(f"{top} is missing")
            continue
        if not os.path.isdir(top):
            reasons.append(f"{top} is no longer a directory")
            continue
        for rel in sorted(recorded):
            reason = size_reason(os.path.join(top, rel), os.path.join(top, rel), recorded[rel])
            if reason:
                reasons.append(reason)
    return reasons


def absent_reasons(patterns):
    """One reason per file matching a glob of files that must not exist (read on every check)."""
    reasons = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern, recursive=True)):
            reasons.append(f"{path} exists and must not (it matches {pattern})")
    return reasons


def scope_reasons(params, rec):
    reasons = []
    asked = {"files": params["files"], "trees": params["trees"], "units": params["units"]}
    recorded = {"files": list(rec["files"]), "trees": list(rec["trees"]), "units": rec["units"]}
    for opt in ("files", "trees", "units"):
        if asked[opt] and unique(asked[opt]) != unique(recorded[opt]):
            reasons.append(f"the record covers other {opt} than this check asks for "
                           f"(recorded: {', '.join(unique(recorded[opt])) or 'none'})")
    return reasons


def check(module, params):
    """(reasons, current phases, their outputs)."""
    path = params["path"]
    key_path = key_path_of(path)
    rec, reason = load_record(path)
    if reason:
        return [reason], [], {}
    try:
        key = read_key(key_path)
    except StateError as exc:
        return [str(exc)], [], {}
    if key is None:
        return [f"the key of the converged record ({key_path}) is missing, so the record cannot be verified"], [], {}
    expected = hmac_hex(key, material(params["fingerprint"], release_secret(params)))
    release_same = hmac.compare_digest(expected, rec["fingerprint_hmac"])
    if not release_same and not params["phases"]:
        return ["the desired release changed since the last whole run "
                "(files, trees and units were not checked)"], [], {}
    skip = {os.path.realpath(path), os.path.realpath(key_path)}
    reasons = scope_reasons(params, rec)
    reasons += file_reasons(key, rec["files"], skip)
    reasons += tree_reasons(rec["trees"])
    reasons += absent_reasons(params["absent"])
    states = unit_states(module, rec["units"])
    reasons += [f"{u} is not active ({s})" for u, s in states.items() if s != "active"]
    # A file matched by two recorded globs is told once.
    reasons = list(dict.fromkeys(reasons))
    recorded = rec.get("phases", {})
    current = [] if reasons else sorted(
        name for name, digest in params["phases"].items()
        if name in recorded
        and hmac.compare_digest(hmac_hex(key, material(digest, phase_secret(params, name))), recorded[name])
    )
    if not release_same:
        reasons.insert(0, "the desired release changed since the last whole run")
    outputs = {name: rec.get("outputs", {}).get(name, {}) for name in current}
    return reasons, current, outputs


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["check", "record"], "default": "check"},
            "path": {"type": "path", "default": "/var/lib/hicache-fleet/converged.json"},
            "fingerprint": {"type": "str", "required": True, "no_log": True},
            "files": {"type": "list", "elements": "path", "default": []},
            "trees": {"type": "list", "elements": "path", "default": []},
            "absent": {"type": "list", "elements": "path", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "phases": {"type": "dict", "default": {}, "no_log": True},
            "secrets": {"type": "dict", "default": {}, "no_log": True},
            "outputs": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = dict(module.params)
    errors = validate(params)
    if errors:
        module.fail_json(msg="invalid options: " + " ".join(errors))
    common = {"path": params["path"], "key_path": key_path_of(params["path"])}
    # Failures end the module outside the except block: a sentence, no traceback attached.
    failure = None
    try:
        if params["state"] == "record":
            result = record(module, params)
        else:
            reasons, current, outputs = check(module, params)
            if reasons:
                msg = "not converged: " + "; ".join(reasons)
                if current:
                    msg += f" (current phases: {', '.join(current)})"
            else:
                msg = f"converged: the record at {params['path']} still holds"
            result = {"changed": False, "converged": not reasons, "reasons": reasons, "msg": msg,
                      "current_phases": current, "outputs": outputs}
    except StateError as exc:
        failure = str(exc)
    if failure:
        module.fail_json(msg=failure, changed=False, **common)
    module.exit_json(**common, **result)


if __name__ == "__main__":
    main()
