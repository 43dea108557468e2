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
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping

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


def current_releases(instances):
    """What each instance's `current` link resolves to ('' without one), as the stat module's
    lnk_source says it (the real path): verify compares it with the candidate's release directory."""
    found = {}
    for instance in instances:
        link = os.path.join(instance["state_dir"], "current")
        found[instance["name"]] = os.path.realpath(link) if os.path.islink(link) else ""
    return found


def interpreter(path):
    """Whether the interpreter at `path` exists and this user may run it (symlinks followed)."""
    exists = os.path.exists(path)
    return {"path": path, "exists": exists, "executable": exists and os.path.isfile(path) and os.access(path, os.X_OK)}


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


# --- prune: old releases, the JIT caches and the L3 directories no kept release uses -------------
# The rules were filters of the role (sglang_service_prune, _prune_caches, _prune_l3, _l3_kept) fed
# by a chain of stat/find/file/slurp tasks; they live here once, and state=prune runs them in one call.


def prune_releases(found, keep, protect, protect_ids=()):
    """Release directories to delete: all but the `keep` newest (by mtime) and the protected ones.

    `found`: {path, mtime} entries; `protect` names directories by path (what the `current` and
    `previous` pointers resolve to); `protect_ids` by release id (a config hash, or its first 12
    characters, which is the directory's name)."""
    ids = {str(i)[:12] for i in protect_ids if i}
    paths = set(protect)
    ordered = sorted(found, key=lambda entry: entry.get("mtime", 0), reverse=True)
    return [
        entry["path"]
        for entry in ordered[max(int(keep), 0):]
        if entry["path"] not in paths and str(entry["path"]).rstrip("/").rsplit("/", 1)[-1] not in ids
    ]


def prune_caches(found, releases):
    """Cache directories to delete: each <cache>/<id> whose release directory (by its name, the id)
    is not among `releases` (the release directories left after pruning). A rollback to a kept
    release finds its cache; a pruned release's cache goes with it."""
    kept = {str(path).rstrip("/").rsplit("/", 1)[-1] for path in releases or []}
    return [str(entry["path"]) for entry in found or []
            if str(entry["path"]).rstrip("/").rsplit("/", 1)[-1] not in kept]


def l3_kept(releases, current_dirs):
    """The releases whose L3 directory stays: the one a `current` pointer names (what the server runs;
    after the rollout's gate it is also what the host validated). An L3 tier is a cache, often hundreds
    of GB: every other kept release (the previous one, the newest kept, an earlier validated one) keeps
    its files but not its pages; a rollback to it starts with an empty directory."""
    current = {str(d).rstrip("/") for d in current_dirs or [] if d}
    return [release for release in releases or [] if str(release.get("release_dir") or "").rstrip("/") in current]


def prune_l3(found, kept):
    """L3 identity directories to delete: each found <root>/<name>/<id> that is not the `dir` of a kept
    release's L3 tier (`kept`: L3 records or release records with an ``l3`` entry, or paths)."""
    keep = set()
    for entry in kept or []:
        if isinstance(entry, Mapping):
            entry = (entry.get("l3") or {}).get("dir") if "l3" in entry else entry.get("dir")
        if entry:
            keep.add(str(entry).rstrip("/"))
    return [str(item["path"]) for item in found or [] if str(item["path"]).rstrip("/") not in keep]


def _real_dir(path):
    """Whether `path` itself is a directory (a symlink, even to one, is not)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def subdirectories(root):
    """The directories directly in `root` as `find file_type=directory` listed them: {path, mtime},
    hidden names left out, a symlink never listed (nor followed), in name order. [] when `root` is
    missing or is not itself a real directory (a symlink there is not descended into)."""
    if not _real_dir(root):
        return []
    found = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.startswith("."):
            continue
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            found.append({"path": path, "mtime": st.st_mtime})
    return found


def _pointer(path):
    """The real path a `current`/`previous` pointer resolves to (stat's lnk_source), None without one."""
    return os.path.realpath(path) if os.path.islink(path) else None


def read_release(release_dir):
    """A release's release.json, parsed; None when it cannot be read (missing, not a file, no access).
    Content that is not JSON is an error: the release's venv and models could not be kept."""
    path = os.path.join(release_dir, "release.json")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON ({exc}): fix or remove that release by hand; nothing was removed") \
            from None


def l3_instance_root(l3_dir, name):
    """<l3_dir>/<name>, the directory an instance's L3 identity directories are in."""
    return re.sub(r"(.)/+$", r"\1", str(l3_dir)) + "/" + name


class PruneRefused(ValueError):
    """A directory prune would read or delete is not where the role keeps it: nothing was removed."""


def prune_plan(instances, keep, protect_ids, l3_dir):
    """What prune removes and keeps, read only. Returns {releases, caches, l3, roots, found,
    kept_releases}: the paths to delete by kind, the directories they may be in (`roots`), every
    directory considered (`found`) and the parsed release.json of every kept release (in instance
    order, then by name; an unreadable one is left out).

    Releases: beyond the `keep` newest per instance, never one a `current` or `previous` pointer (of
    any instance) resolves to, nor one named in `protect_ids`. Caches: <cache_root>/<id> whose
    release (by id, any instance's) is not kept. L3: <l3_dir>/<name>/<id> unless it is the L3 directory
    of a kept release a `current` pointer names, or a planned one (instances[].l3.dir)."""
    pointers = {}
    for instance in instances:
        for which in ("current", "previous"):
            pointers[(instance["name"], which)] = _pointer(os.path.join(instance["state_dir"], which))
    targets = {target for target in pointers.values() if target}
    roots, found_releases, pruned = [], [], []
    for instance in instances:
        releases_dir = instance["releases_dir"]
        if os.path.islink(releases_dir):
            raise PruneRefused(f"instance {instance['name']}: {releases_dir} is a symlink, not the releases directory "
                               "the role makes (root's, 0700); nothing was removed. Replace it with a directory.")
        found = subdirectories(releases_dir)
        found_releases += found
        # A pointer resolves to a real path; a release is protected when its own real path is that one
        # (the same directory when the state directory is reached through a symlink).
        protect = sorted(targets) + [e["path"] for e in found if os.path.realpath(e["path"]) in targets]
        pruned += prune_releases(found, keep, protect, protect_ids)
        roots.append(releases_dir)
    kept_dirs = [entry["path"] for entry in found_releases if entry["path"] not in pruned]
    found_caches, found_l3 = [], []
    for instance in instances:
        l3_root = l3_instance_root(l3_dir, instance["name"])
        found_caches += subdirectories(instance["cache_root"])
        found_l3 += subdirectories(l3_root)
        roots += [instance["cache_root"], l3_root]
    caches = prune_caches(found_caches, kept_dirs)
    kept_releases = [record for record in (read_release(path) for path in kept_dirs) if record is not None]
    current = {target for (_name, which), target in pointers.items() if which == "current" and target}
    records = [r for r in kept_releases if isinstance(r, Mapping)]
    current_dirs = sorted(current) + [str(r["release_dir"]) for r in records if r.get("release_dir")
                                      and os.path.realpath(str(r["release_dir"])) in current]
    l3_keep = l3_kept(records, current_dirs)
    l3 = prune_l3(found_l3, l3_keep + [instance.get("l3") or {} for instance in instances])
    return {"releases": pruned, "caches": caches, "l3": l3, "roots": roots,
            "found": [entry["path"] for entry in found_releases + found_caches + found_l3],
            "kept_releases": kept_releases}


def remove_tree(path, roots):
    """Delete the directory `path` if it is a real directory directly in one of `roots` (themselves
    real directories), checked right before: a symlink put there since it was listed is left alone, and
    shutil.rmtree never follows one inside it. True if removed."""
    parent = os.path.dirname(path)
    if os.path.normpath(parent) not in roots or not _real_dir(parent) or not _real_dir(path):
        return False
    shutil.rmtree(path)
    return True


def prune(instances, keep, protect_ids, l3_dir, check_mode, want_diff=False):
    """Remove the releases, JIT caches and L3 directories prune_plan names (in check mode, none).

    Returns {removed, refused, kept_releases, diff, changed}: `removed` the directories deleted (or
    that would be), `refused` those left alone because they were no longer a real directory in their
    root, `diff` (with `want_diff`) every directory considered, before and after."""
    plan = prune_plan(instances, keep, protect_ids, l3_dir)
    roots = {os.path.normpath(root) for root in plan["roots"]}
    removed, refused = [], []
    for path in plan["releases"] + plan["caches"] + plan["l3"]:
        if check_mode:
            removed.append(path)
        elif remove_tree(path, roots):
            removed.append(path)
        else:
            refused.append(path)
    result = {"removed": removed, "refused": refused, "kept_releases": plan["kept_releases"],
              "changed": bool(removed)}
    if want_diff:
        result["diff"] = {"before_header": "directories (prune)", "after_header": "directories (prune)",
                          "before": "".join(f"{path}\n" for path in plan["found"]),
                          "after": "".join(f"{path}\n" for path in plan["found"] if path not in removed)}
    return result
