# hicache-fleet: stage an SGLang service release on the host (library/sglang_service_release.py).
# Runs on the managed host with its system Python: standard library only.
"""What staging a release is, as one operation: compare each instance's live unit, env file and
secrets file with the candidate (read only), and keep the candidate as a release directory
<releases>/<hash12>/ with its files (unit, argv.json, release.json, env, secrets.yaml), root-owned,
0700 for the directory and 0600 for the files. A file already there with the same content, owner
and mode is left alone, so staging the same release again changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile

DIR_MODE = 0o700
FILE_MODE = 0o600
# The release files an instance always has; secrets.yaml only when it has keys.
RELEASE_FILES = ("unit", "argv.json", "release.json", "env")


def _sha256_of(path):
    """The sha256 of a file's content, or None when there is no regular file there."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _sha256(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def live_differs(instance, env, secrets):
    """Whether the instance's live unit, env file or secrets file differs from the candidate.

    An instance without keys (secrets '') must have no secrets file; one with keys, a file with
    exactly the candidate's content. A missing unit or env file differs from any candidate.
    """
    if _sha256_of(instance["unit_path"]) != _sha256(instance["unit"]):
        return True
    if _sha256_of(instance["env_path"]) != _sha256(env):
        return True
    live_secrets = _sha256_of(instance["secrets_path"])
    if secrets:
        return live_secrets != _sha256(secrets)
    return os.path.lexists(instance["secrets_path"])


def release_files(instance, env, secrets):
    """The files of the instance's release directory: {file name: content}."""
    files = {
        "unit": instance["unit"],
        "argv.json": instance["argv_json"],
        "release.json": instance["release_json"],
        "env": env,
    }
    if secrets:
        files["secrets.yaml"] = secrets
    return files


def _owned_as(st, mode, owner):
    return stat.S_IMODE(st.st_mode) == mode and (owner is None or (st.st_uid, st.st_gid) == owner)


def ensure_dir(path, check_mode, owner=None):
    """The release directory, mode 0700 (its parents as for `file state=directory`). True if changed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not check_mode:
            os.makedirs(path, mode=DIR_MODE)
            os.chmod(path, DIR_MODE)
            if owner is not None:
                os.chown(path, *owner)
        return True
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path} exists and is not a directory")
    if _owned_as(st, DIR_MODE, owner):
        return False
    if not check_mode:
        os.chmod(path, DIR_MODE)
        if owner is not None:
            os.chown(path, *owner)
    return True


def ensure_file(path, content, check_mode, owner=None, mode=FILE_MODE):
    """A file with exactly `content`, owner and `mode` (0600 unless given), written atomically.
    True if changed (in check mode: if it would be)."""
    data = content.encode("utf-8")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and _owned_as(st, mode, owner):
        with open(path, "rb") as handle:
            if handle.read() == data:
                return False
    if check_mode:
        return True
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".staging-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if owner is not None:
            os.chown(tmp, *owner)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return True


def stage(instances, env, secrets, check_mode, owner=None):
    """Stage every instance's release. Returns {pending, written, changed}.

    `pending`: names of the instances whose live files differ from the candidate (activating the
    release restarts them), in the order given. `written`: the release paths created or rewritten
    (or that would be, in check mode); their content is never returned.
    """
    pending, written = [], []
    for instance in instances:
        name = instance["name"]
        env_text = env.get(name, "")
        secrets_text = secrets.get(name, "") or ""
        if live_differs(instance, env_text, secrets_text):
            pending.append(name)
        release_dir = instance["release_dir"]
        if ensure_dir(release_dir, check_mode, owner):
            written.append(release_dir)
        for file_name, content in release_files(instance, env_text, secrets_text).items():
            path = os.path.join(release_dir, file_name)
            if ensure_file(path, content, check_mode, owner):
                written.append(path)
    return {"pending": pending, "written": written, "changed": bool(written)}


# --- activate: the staged release becomes the live one ------------------------------------------

UNIT_MODE = 0o644
ENV_MODE = 0o600
# The live secrets file is root's alone: the unit hands it to its instance as a systemd credential
# (LoadCredential=secrets.yaml:<path>, SGLang reads --config %d/secrets.yaml), so no other instance's
# user, nor the service group, can read it.
SECRETS_MODE = 0o600
# A release staged before the credential (its unit reads --config <path> as the service user) needs
# the file readable by the service group: only a rollback to such a release writes it so.
LEGACY_SECRETS_MODE = 0o640
CREDENTIAL_LINE = "LoadCredential=secrets.yaml:"


def _read_text(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def ensure_link(path, target, check_mode, owner=None):
    """`path` is a symlink to `target` (replaced atomically). True if changed."""
    if os.path.islink(path) and os.readlink(path) == target:
        return False
    if not check_mode:
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(target, tmp)
        if owner is not None:
            os.lchown(tmp, *owner)
        os.replace(tmp, path)
    return True


def remove_file(path, check_mode):
    """No file at `path`. True if one was there (in check mode: is there)."""
    if not os.path.lexists(path):
        return False
    if not check_mode:
        os.unlink(path)
    return True


def _nice_json(value):
    """JSON as Ansible's to_nice_json writes it (indent 4, sorted keys, ASCII)."""
    return json.dumps(value, indent=4, sort_keys=True, separators=(",", ": "))


def adopt(instance, unit_sum, check_mode, owner=None):
    """Keep a unit that was there before the role managed the instance (no `current` pointer) as the
    release releases/adopted-<sha12>/ (its unit, env and secrets file as they are, and a release.json
    naming it), and make it the `previous` release. Returns the paths changed."""
    adopted = os.path.join(instance["releases_dir"], f"adopted-{unit_sum[:12]}")
    changed = []
    if ensure_dir(adopted, check_mode, owner):
        changed.append(adopted)
    for source, name in ((instance["unit_path"], "unit"), (instance["env_path"], "env"),
                         (instance["secrets_path"], "secrets.yaml")):
        text = _read_text(source)
        if text is not None and ensure_file(os.path.join(adopted, name), text, check_mode, owner):
            changed.append(os.path.join(adopted, name))
    record = {"name": instance["name"], "unit": instance["unit_name"], "bind": instance["bind"],
              "port": int(instance["port"]), "profile": "adopted", "config_hash": f"adopted-{unit_sum}"}
    if ensure_file(os.path.join(adopted, "release.json"), _nice_json(record) + "\n", check_mode, owner):
        changed.append(os.path.join(adopted, "release.json"))
    previous = os.path.join(instance["state_dir"], "previous")
    if ensure_link(previous, adopted, check_mode, owner):
        changed.append(previous)
    return changed


def _diff(path, before, after):
    return {"before_header": path, "after_header": path, "before": before or "", "after": after}


def activate(instances, env, secrets, changing, check_mode, owner=None, want_diff=False):
    """Install each instance's staged release: for an instance in `changing`, the release `current`
    points at becomes `previous` (or a unit that was there unmanaged is adopted as `previous`); then
    every instance's env file (0600), secrets file (0600, root's: the unit loads it as a credential;
    none without keys) and unit (0644) are written where they differ, and `current` points at the
    staged release.

    Returns {restart, units_changed, changed_paths, diff, changed}: `restart` names the instances
    whose env, secrets or unit file changed (they restart), in the order given; `diff` (with
    `want_diff`) the unit and env changes, never the secrets file's.
    """
    restart, changed_paths, diffs = [], [], []
    units_changed = False
    root = owner
    for instance in instances:
        name = instance["name"]
        current = os.path.join(instance["state_dir"], "current")
        if name in changing:
            if os.path.islink(current):
                # Compared as real paths on both sides: a state dir reached through a symlink must
                # not make the staged release its own `previous` (that would lose the rollback target).
                live = os.path.realpath(current)
                if live != os.path.realpath(instance["release_dir"]):
                    previous = os.path.join(instance["state_dir"], "previous")
                    if ensure_link(previous, live, check_mode, root):
                        changed_paths.append(previous)
            else:
                unit_sum = _sha256_of(instance["unit_path"])
                if unit_sum is not None:
                    changed_paths.extend(adopt(instance, unit_sum, check_mode, root))
        files_changed = False
        env_text = env.get(name, "")
        env_before = _read_text(instance["env_path"])
        if ensure_file(instance["env_path"], env_text, check_mode, root, ENV_MODE):
            files_changed = True
            changed_paths.append(instance["env_path"])
            if want_diff and env_before != env_text:
                diffs.append(_diff(instance["env_path"], env_before, env_text))
        secrets_text = secrets.get(name, "") or ""
        if secrets_text:
            wrote = ensure_file(instance["secrets_path"], secrets_text, check_mode, root, SECRETS_MODE)
        else:
            wrote = remove_file(instance["secrets_path"], check_mode)
        if wrote:
            files_changed = True
            changed_paths.append(instance["secrets_path"])
        unit_before = _read_text(instance["unit_path"])
        if ensure_file(instance["unit_path"], instance["unit"], check_mode, root, UNIT_MODE):
            files_changed = units_changed = True
            changed_paths.append(instance["unit_path"])
            if want_diff and unit_before != instance["unit"]:
                diffs.append(_diff(instance["unit_path"], unit_before, instance["unit"]))
        if files_changed:
            restart.append(name)
        if ensure_link(current, instance["release_dir"], check_mode, root):
            changed_paths.append(current)
    return {"restart": restart, "units_changed": units_changed, "changed_paths": changed_paths,
            "diff": diffs, "changed": bool(changed_paths)}


# --- scratch: the candidate's files for SGLang's parser and systemd-analyze ----------------------


def scratch(instances, env, secrets, owner=None):
    """Write each instance's candidate into its scratch directory (root only, 0700): the unit (0644,
    under its unit name), the env file, the secrets file when it has keys (removed when it has none)
    and argv.json (0600). These
    files are only read by the checks of the release (nothing runs from them), so writing them is
    never a change. Returns the paths rewritten."""
    written = []
    for instance in instances:
        name, directory = instance["name"], instance["staging_dir"]
        ensure_dir(directory, False, owner)
        files = [(instance["unit_name"], instance["unit"], UNIT_MODE), (f"{name}.env", env.get(name, ""), FILE_MODE),
                 ("argv.json", instance["check_argv_json"], FILE_MODE)]
        secrets_text = secrets.get(name, "") or ""
        if secrets_text:
            files.append(("secrets.yaml", secrets_text, FILE_MODE))
        elif remove_file(os.path.join(directory, "secrets.yaml"), False):
            # The keys were removed from the instance: no copy of the old ones stays behind.
            written.append(os.path.join(directory, "secrets.yaml"))
        for file_name, content, mode in files:
            path = os.path.join(directory, file_name)
            if ensure_file(path, content, False, owner, mode):
                written.append(path)
    return written


# --- rollback: the keys stay those of the inventory now --------------------------------------------


def loads_credential(unit_path):
    """Whether the unit at `unit_path` hands the secrets file to SGLang as a systemd credential."""
    text = _read_text(unit_path) or ""
    return any(line.startswith(CREDENTIAL_LINE) for line in text.splitlines())


class RollbackRefused(ValueError):
    """A rollback that would change which keys an instance serves with: nothing was written."""


def rollback_secrets(instances, secrets, check_mode, owner=None, secrets_gid=None):
    """The secrets file of each instance rolled back to the release `release_dir` names: the keys of
    the inventory now (`secrets`), never those the release was staged with (its secrets.yaml holds
    the keys of that time; a rotated key must not come back). An instance whose release and the
    inventory disagree on having keys at all is refused, every instance checked before anything is
    written: a release staged with keys reads them from the file (with none now it would not
    start), one staged without would serve without the key the inventory sets now.

    The file is root's alone (0600) when the release's unit loads it as a systemd credential; a
    release staged before that (its unit passes the path and SGLang opens it as the service user)
    gets it as that release expects, root:<secrets_gid> 0640, or it would not start.

    Returns {kept, changed_paths, changed}: `kept` names the instances whose current keys stay.
    Raises RollbackRefused naming each refused instance and what to do.
    """
    refusals = []
    for instance in instances:
        name, release = instance["name"], os.path.basename(instance["release_dir"].rstrip("/"))
        had_keys = os.path.lexists(os.path.join(instance["release_dir"], "secrets.yaml"))
        has_keys = bool(secrets.get(name))
        if had_keys and not has_keys:
            refusals.append(f"{name}: release {release} was staged with api keys and the inventory sets none now "
                            "(its old keys are not brought back)")
        elif has_keys and not had_keys:
            refusals.append(f"{name}: release {release} was staged without an api key and would serve without "
                            "the key the inventory sets now")
    if refusals:
        raise RollbackRefused("rollback refused, nothing changed: " + "; ".join(refusals)
                              + ". Fix the instance's config and run the rollout again, or roll back by hand.")
    kept, changed_paths = [], []
    legacy_owner = None if owner is None else (owner[0], owner[1] if secrets_gid is None else secrets_gid)
    for instance in instances:
        text = secrets.get(instance["name"], "") or ""
        if text:
            kept.append(instance["name"])
            if loads_credential(os.path.join(instance["release_dir"], "unit")):
                mode, secrets_owner = SECRETS_MODE, owner
            else:
                mode, secrets_owner = LEGACY_SECRETS_MODE, legacy_owner
            if ensure_file(instance["secrets_path"], text, check_mode, secrets_owner, mode):
                changed_paths.append(instance["secrets_path"])
        elif remove_file(instance["secrets_path"], check_mode):
            changed_paths.append(instance["secrets_path"])
    return {"kept": kept, "changed_paths": changed_paths, "changed": bool(changed_paths)}


# --- drop-ins: a unit's overrides the toolkit did not write ----------------------------------------


class DropinsRefused(ValueError):
    """A drop-in the toolkit did not write overrides an instance's unit: nothing was changed."""


def foreign_dropins(instances):
    """{instance name: [drop-in files]} for each instance with a `*.conf` in one of its
    `dropin_dirs` (its own `<unit>.d/` and the prefix `sglang-.service.d/`, under /etc and /run).
    The toolkit writes none: every one found is foreign and can undo the unit's sandbox."""
    found = {}
    for instance in instances:
        files = []
        for directory in instance.get("dropin_dirs") or []:
            try:
                names = sorted(os.listdir(directory))
            except (FileNotFoundError, NotADirectoryError):
                continue
            files.extend(os.path.join(directory, n) for n in names if n.endswith(".conf"))
        if files:
            found[instance["name"]] = list(dict.fromkeys(files))
    return found


def dropins(instances, remove, check_mode):
    """Refuse (DropinsRefused, naming every file and the fix) or, with `remove`, delete the foreign
    drop-ins of the instances. Returns {instances, removed, changed}: `instances` names those that had
    one (with `remove` they restart), `removed` the files deleted (or that would be, in check mode)."""
    found = foreign_dropins(instances)
    if found and not remove:
        listed = "; ".join(f"{name}: {', '.join(files)}" for name, files in found.items())
        raise DropinsRefused(
            f"refused, nothing changed: systemd drop-ins this toolkit did not write override the SGLang units "
            f"({listed}). A drop-in can undo the unit's sandbox (User=root, ExecStartPre=+...). Move what it "
            "must set into the inventory (sglang_service_unit_extra) and delete it, or set "
            "sglang_service_remove_foreign_dropins: true to have the role delete it and restart the instance.")
    removed = []
    for files in found.values():
        for path in files:
            if os.path.lexists(path) and path not in removed:
                if not check_mode:
                    os.unlink(path)
                removed.append(path)
    return {"instances": list(found), "removed": removed, "changed": bool(removed)}
