#!/usr/bin/python
# hicache-fleet: read, take and release one run lock file (roles/rollout/tasks/lock.yml, unlock.yml).
# Runs on the managed host (and on the controller) with its system Python: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_run_lock
short_description: Read, take or release one hicache-fleet run lock file
description:
  - >-
    A run lock is a small JSON record (owner, controller, controller_id, pid, pid_start, run_id,
    started, started_epoch, playbooks) in a file of mode C(0600). This module never returns or
    prints the content of a file that is not such a record: it says why it is not one.
  - >-
    O(state=read) returns RV(lock) (the record) or RV(invalid) (why the file is not a lock record:
    not a regular file, too large, not JSON, a missing, unknown or mistyped key). A symlink is
    never followed.
  - >-
    O(state=take) writes O(record) beside O(path) (mode C(0600)) and makes it the lock: with no
    O(expect), by a hard link that fails when the lock exists; with O(expect) (the stale lock the
    controller decided to take over), under a mutex file C(<path>.takeover) created exclusively, only
    while the lock is still the expected one, by a rename. Two runs cannot both win: the second
    finds the mutex or a lock that is no longer the expected one. The lock is read back after.
  - >-
    O(state=release) removes the lock only while it is still O(record)'s (same run id,
    controller_id, pid and pid start).
version_added: "0.1.0"
author: hicache-fleet maintainers (!UNKNOWN)
options:
  state:
    description: What to do with the lock at O(path).
    type: str
    choices: [read, take, release]
    default: read
  path:
    description: The lock file (an absolute path; the caller validates where it may be).
    type: path
    required: true
  record:
    description: This run's lock record (O(state=take) and O(state=release)).
    type: dict
  expect:
    description:
      - The stale lock to take over (its run_id, controller_id, pid and pid_start); O(state=take) only.
      - Omitted, the lock is taken only when there is none.
    type: dict
attributes:
  check_mode:
    description: O(state=take) and O(state=release) change nothing in check mode.
    support: full
  diff_mode:
    description: A lock record is run bookkeeping, nothing worth showing as a diff.
    support: none
"""

EXAMPLES = r"""
- name: Take the run lock
  fleet_run_lock:
    path: /var/lib/hicache-fleet/rollout.lock
    state: take
    record: "{{ rollout_lock }}"
"""

RETURN = r"""
lock:
  description: The lock record found (O(state=read)), or null when there is none or it is invalid.
  returned: always
  type: dict
invalid:
  description: Why the file at O(path) is not a lock record (its content is never shown), or null.
  returned: always
  type: str
released:
  description: O(state=release) removed the lock (it was this run's).
  returned: when state is release
  type: bool
"""

import errno
import json
import os
import stat

from ansible.module_utils.basic import AnsibleModule

MAX_BYTES = 4096
# Every key of a lock record and the types it may have (None: JSON null).
FIELDS = {
    "owner": (str,),
    "controller": (str,),
    "controller_id": (str,),
    "pid": (int,),
    "pid_start": (str, type(None)),
    "run_id": (str,),
    "started": (str,),
    "started_epoch": (int,),
    "playbooks": (list,),
}
IDENTITY = ("run_id", "controller_id", "pid", "pid_start")


def record_problem(record):
    """Why `record` is not a lock record (None when it is one). Names keys, never values."""
    if not isinstance(record, dict):
        return "its JSON is not an object"
    missing = sorted(set(FIELDS) - set(record))
    if missing:
        return "key(s) missing: " + ", ".join(missing)
    if set(record) - set(FIELDS):
        return f"{len(set(record) - set(FIELDS))} unknown key(s)"
    for key, types in FIELDS.items():
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, types):
            return f"key {key} has the wrong type"
    if record["pid"] <= 0:
        return "key pid is not a process id"
    if not all(isinstance(item, str) for item in record["playbooks"]):
        return "key playbooks is not a list of names"
    if any(len(record[key]) > 200 for key in FIELDS if isinstance(record[key], str)):
        return "a value is longer than 200 characters"
    return None


def identity(record):
    return tuple((record or {}).get(key) for key in IDENTITY)


def read_lock(path):
    """(record, invalid): (None, None) when there is no lock file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None, None
        if exc.errno == errno.ELOOP:
            return None, "it is a symlink"
        return None, f"it cannot be read ({os.strerror(exc.errno)})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "it is not a regular file"
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        return None, f"it is larger than {MAX_BYTES} bytes"
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, "it is not JSON"
    problem = record_problem(record)
    return (None, problem) if problem else (record, None)


class LockError(Exception):
    pass


def write_new(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def take(path, record, expect):
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    tmp = f"{path}.{record['run_id']}.{record['pid']}.tmp"
    data = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    write_new(tmp, data)
    try:
        if expect is None:
            try:
                os.link(tmp, path)
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise
                held, _invalid = read_lock(path)
                if identity(held) != identity(record):
                    raise LockError("another run took the lock meanwhile") from None
        else:
            mutex = path + ".takeover"
            try:
                write_new(mutex, data)
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise
                raise LockError(
                    f"another run is taking over this lock at this moment ({mutex} exists; if no run is, "
                    "remove that file)"
                ) from None
            try:
                held, invalid = read_lock(path)
                if invalid:
                    raise LockError(f"the lock file is no longer a lock record ({invalid})")
                if held is None:
                    os.link(tmp, path)
                elif identity(held) == identity(expect):
                    os.rename(tmp, path)
                elif identity(held) != identity(record):
                    raise LockError("the lock changed since it was read: another run took it over")
            finally:
                os.unlink(mutex)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    held, _invalid = read_lock(path)
    if identity(held) != identity(record):
        raise LockError("the lock read back is not this run's: another run took it over")


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["read", "take", "release"], "default": "read"},
            "path": {"type": "path", "required": True},
            "record": {"type": "dict"},
            "expect": {"type": "dict"},
        },
        required_if=[("state", "take", ["record"]), ("state", "release", ["record"])],
        supports_check_mode=True,
    )
    params = module.params
    path, state = params["path"], params["state"]
    if not os.path.isabs(path):
        module.fail_json(msg="path must be absolute")
    result = {"changed": False, "path": path, "lock": None, "invalid": None}
    if state != "read":
        problem = record_problem(params["record"])
        if problem:
            module.fail_json(msg="record is not a lock record: " + problem, **result)
    held, invalid = read_lock(path)
    result.update(lock=held, invalid=invalid)
    failure = None
    if state == "release":
        result["released"] = False
        if held is not None and identity(held) == identity(params["record"]):
            if not module.check_mode:
                os.unlink(path)
            result["released"] = True
    elif state == "take" and not module.check_mode:
        try:
            take(path, params["record"], params["expect"])
            result.update(lock=params["record"], invalid=None)
        except (LockError, OSError) as exc:
            failure = str(exc) if isinstance(exc, LockError) else f"cannot write the lock: {exc.strerror or exc}"
    if failure:
        module.fail_json(msg=failure, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
