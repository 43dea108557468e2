# hicache-fleet: stage an SGLang service release on the host (library/sglang_service_release.py).
# Runs on the managed host with its system Python: standard library only.
"""What staging a release is, as one operation: compare each instance's live unit, env file and
secrets file with the candidate (read only), and keep the candidate as a release directory
<releases>/<hash12>/ with its files (unit, argv.json, release.json, env, secrets.yaml), root-owned,
0700 for the directory and 0600 for the files. A file already there with the same content, owner
and mode is left alone, so staging the same release again changes nothing."""

from __future__ import annotations

import hashlib
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


def ensure_file(path, content, check_mode, owner=None):
    """One release file with exactly `content`, mode 0600, written atomically. True if changed."""
    data = content.encode("utf-8")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and _owned_as(st, FILE_MODE, owner):
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
        os.chmod(tmp, FILE_MODE)
        if owner is not None:
            os.chown(tmp, *owner)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return True


def stage(instances, env, secrets, check_mode, owner=None):
    """Stage every instance's release. Returns {pending, written, live_units, changed}.

    `pending`: names of the instances whose live files differ from the candidate (activating the
    release restarts them), in the order given. `written`: the release paths created or rewritten
    (or that would be, in check mode); their content is never returned. `live_units`: per instance,
    whether its live unit file exists and its sha256 (a unit there before the role managed it is kept
    as a release by `activate`).
    """
    pending, written, live_units = [], [], []
    for instance in instances:
        name = instance["name"]
        unit_sum = _sha256_of(instance["unit_path"])
        # Shaped as ansible.builtin.stat's result: the adopt step of `activate` reads it.
        live_units.append({"stat": {"exists": unit_sum is not None, "checksum": unit_sum or ""}})
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
    return {"pending": pending, "written": written, "live_units": live_units, "changed": bool(written)}
