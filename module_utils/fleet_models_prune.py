# hicache-fleet: which store copies, downloads and links of the earlier layout go (library/models_prune.py).
# The one implementation of the models role's prune: what is on the host, what a kept path keeps,
# what goes, and the removal. Plain functions, unit-tested in tests/models/test_models_prune.py.
# Runs on the managed host with its system Python: standard library only.

from __future__ import annotations

import os
import posixpath
import shutil
from collections.abc import Sequence
from typing import Any

ARGUMENT_SPEC = {
    "models_dir": {"type": "str", "required": True},
    "keep": {"type": "list", "elements": "str", "required": True},
    "plan_paths": {"type": "list", "elements": "str", "default": []},
}


def _norm(path: str) -> str:
    return posixpath.normpath(str(path)) if path else ""


def keep_problems(keep: Any, models_dir: str) -> list[str]:
    """Why a keep list cannot be used (models_prune_keep); empty when it can."""
    fix = ("set models_prune_keep to the model paths of the host's current, previous and validated "
           "releases (absolute paths)")
    if isinstance(keep, str) or not isinstance(keep, Sequence):
        return [f"models_prune_keep must be a list of absolute paths, not {type(keep).__name__}; {fix}"]
    if not keep:
        return [f"models_prune_keep is empty: refusing to prune, every store copy would be a candidate; {fix}"]
    problems = [f'models_prune_keep entry "{p}" is not an absolute path' for p in keep if not str(p).startswith("/")]
    root = _norm(models_dir) + "/"
    if not problems and not any(_norm(p).startswith(root) for p in keep):
        problems.append(f"models_prune_keep names nothing under models_dir ({models_dir}): refusing to prune; {fix}")
    return problems


def prune_paths(found: Sequence[str], keep: Sequence[str]) -> list[str]:
    """The found entries (store copies, staging dirs, legacy links) that no kept path names.
    An entry is kept when a kept path is that entry or lies inside it."""
    kept = {_norm(k) for k in keep if k}
    out = []
    for entry in found:
        path = _norm(entry)
        if not any(k == path or k.startswith(path + "/") for k in kept):
            out.append(path)
    return sorted(out)


def _children(path: str, hidden: bool) -> list[str]:
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [os.path.join(path, n) for n in sorted(names) if hidden or not n.startswith(".")]


def survey(models_dir: str, keep: Sequence[str], plan_paths: Sequence[str]) -> dict[str, list[str]]:
    """What is on the host and what goes. Read-only.

    found: the entries of <models_dir>/.store and <models_dir>/.staging (hidden ones too) and the
    links directly in models_dir (not hidden) that point into <models_dir>/.store/ as written (the
    earlier layout's models_dir/<name>; other links are not the role's and are left alone).
    kept: the keep list, what each kept link resolves to and its target as written (when absolute;
    the earlier layout wrote models_dir/.store/..., which differs from the resolved path when
    models_dir is behind a symlink), and the plan's paths (the newest staged revisions).
    """
    root = _norm(models_dir)
    found = [*_children(os.path.join(root, ".store"), hidden=True),
             *_children(os.path.join(root, ".staging"), hidden=True)]
    store_prefix = root + "/.store/"
    for path in _children(root, hidden=False):
        if os.path.islink(path) and os.readlink(path).startswith(store_prefix):
            found.append(path)
    kept = [str(k) for k in keep]
    for path in keep:
        if os.path.islink(path):
            kept.append(os.path.realpath(path))
            target = os.readlink(path)
            if target.startswith("/"):
                kept.append(target)
    kept += [str(p) for p in plan_paths if p]
    unique_kept = list(dict.fromkeys(_norm(k) for k in kept))
    return {"kept": unique_kept, "removed": prune_paths(found, unique_kept)}


class PruneError(OSError):
    """A removal failed: which path, and what had been removed before it."""

    def __init__(self, path: str, removed: list[str], cause: OSError):
        super().__init__(f"roles/models prune: could not remove {path}: {cause.strerror or cause}; "
                         f"removed before it: {', '.join(removed) or 'nothing'}; nothing after it was removed")
        self.removed = list(removed)


def remove(path: str) -> None:
    """Remove one entry: a link or a file by itself, a directory with what is in it."""
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
    else:
        shutil.rmtree(path)


def prune(models_dir: str, keep: Sequence[str], plan_paths: Sequence[str], check_mode: bool) -> dict[str, Any]:
    """Survey, then (unless check_mode) remove what goes. Raises ValueError on an unusable keep list,
    before anything is read or removed."""
    problems = keep_problems(keep, models_dir)
    if problems:
        raise ValueError("roles/models prune: " + "; ".join(problems))
    result = survey(models_dir, keep, plan_paths)
    if not check_mode:
        done: list[str] = []
        for path in result["removed"]:
            try:
                if os.path.lexists(path):
                    remove(path)
            except OSError as exc:
                raise PruneError(path, done, exc) from exc
            done.append(path)
    result["changed"] = bool(result["removed"])
    result["diff"] = {
        "before": "".join(f"{p}\n" for p in sorted(result["removed"])),
        "after": "",
        "before_header": f"{models_dir}: store copies, downloads and links no kept release reads",
        "after_header": f"{models_dir}: removed",
    }
    return result
