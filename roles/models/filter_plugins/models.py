"""Filters of the models role: the models as a plan, file checks against a manifest (what to
prune: module_utils/fleet_models_prune.py, one module call on the host).

Plain functions (testable without Ansible) exposed as Jinja filters:

- ``models_plan(main, draft, models_dir)``: the main model and the draft (``None`` when the draft
  is disabled) normalised into ``{models, problems, paths, release}``: each model with its sorted
  manifest, its manifest hash and its versioned store path ``<models_dir>/.store/<name>-<hash[:12]>``
  (deterministic: the same manifest always gives the same path); every input problem collected as a
  sentence naming the variable. A ``manifest_file`` is read here, on the controller.
- ``models_file_problems(stat_results, check_sha256)``: the files of a registered ``stat`` loop that do
  not match their manifest entry (``item``), as ``[{path, msg}]``.
- ``models_fetch_errors(results)``: why items of a fetch loop failed (get_url's checksum refusal rephrased).
- ``models_manifest_from_hf_tree(entries)`` / ``models_manifest_from_find(found, root)``: a manifest
  from the Hub's tree API at a pinned revision, or from a local directory (playbooks/model_manifest.yml).
- ``models_hf_env(endpoint, token, token_file)``: the environment of an hf download (the endpoint
  and the token file only when set).
- ``models_escapes(root, paths)`` / ``models_resolved_outside(resolved, paths)``: the files of a model
  directory that resolve (symbolic links followed) outside it, on the controller or from a host's
  ``realpath`` output (issue 24: a link in a model directory must not ship another file).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

# Whole-string matches only (``fullmatch``): ``^...$`` with ``match`` accepts a trailing newline.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SIZE = re.compile(r"[0-9]+")
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SOURCES = ("hf", "http", "sync")


def manifest_path_problem(path: str) -> str | None:
    """Why ``path`` (a manifest entry's path) cannot be used, or ``None``.

    A manifest path becomes an argument of the download tool and a path under the model directory:
    it must be relative, without ``..``, ``.`` or empty parts, without control characters, and must
    not start with ``-`` (the tool would read it as an option).
    """
    if _CONTROL.search(path):
        return f"manifest path {json.dumps(path)} holds a control character"
    if not path or path.startswith("/") or ".." in path.split("/"):
        return f'manifest path "{path}" must be relative, without ..'
    if path.startswith("-"):
        return f'manifest path "{path}" must not start with "-" (the download tool would read it as an option)'
    if any(part in ("", ".") for part in path.split("/")):
        return f'manifest path "{path}" must not hold empty or "." parts (write it as a/b, not a//b or ./a)'
    return None


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip("/") + "/")


def models_escapes(root: str, paths: Sequence[str]) -> list[dict[str, str]]:
    """The ``paths`` (relative to ``root``, on the machine running this: the controller) whose real
    path, every symbolic link resolved, lies outside the real path of ``root``: ``[{path, real}]``."""
    real_root = os.path.realpath(root)
    out = []
    for path in paths:
        real = os.path.realpath(os.path.join(root, path))
        if not _inside(real, real_root):
            out.append({"path": str(path), "real": real})
    return out


_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)(\s*;[^\\]*)?(\s*\\)?")


def models_requirements_pin(text: str, name: str) -> str:
    """The version a pip requirements file pins ``name`` to (``name==version``; names compared the
    way pip does: case, ``-``, ``_`` and ``.`` alike), or "" when it pins none."""
    def norm(value: str) -> str:
        return re.sub(r"[-_.]+", "-", value).lower()
    for line in str(text).splitlines():
        match = _PIN.fullmatch(line.strip())
        if match and norm(match.group(1)) == norm(name):
            return match.group(2)
    return ""


def models_hf_argv(model: Mapping[str, Any], hf: str, max_workers: Any) -> list[str]:
    """``hf download`` of exactly the model's manifest files at its pinned commit into its staging
    directory. Options first, then ``--``: the repository id and the file names after it are never
    read as options (a manifest path ``--help`` or ``-x`` is a file name to hf, not a flag)."""
    options = ["--revision", str(model["hf_revision"]), "--local-dir", str(model["staging"]),
               "--max-workers", str(max_workers)]
    return [str(hf), "download", *options, "--", str(model["hf_repo_id"])] + [str(f["path"]) for f in model["files"]]


def models_realpath_argv(files: Sequence[Mapping[str, Any]], root: str) -> list[str]:
    """``realpath -m -- <root> <root>/<path>...`` for a model's manifest files on a host."""
    root = str(root).rstrip("/") or "/"
    return ["realpath", "-m", "--", root] + [f"{root}/{f['path']}" for f in files]


def models_resolved_outside(resolved: Sequence[str], paths: Sequence[str]) -> list[dict[str, str]]:
    """The same as ``models_escapes`` from a host's ``realpath -m -- <root> <root>/<path>...`` output
    (``resolved``: one line per argument, the root first)."""
    lines = [str(line) for line in resolved]
    if len(lines) != len(paths) + 1:
        return [{"path": "?", "real": f"realpath answered {len(lines)} lines for {len(paths) + 1} paths"}]
    root = lines[0]
    return [{"path": str(p), "real": r} for p, r in zip(paths, lines[1:], strict=True) if not _inside(r, root)]


def manifest_sha256(files: Sequence[Mapping[str, Any]]) -> str:
    """sha256 of the canonical manifest: ``[[path, sha256, size], ...]`` sorted by path, as JSON."""
    canon = [[f["path"], f["sha256"], int(f["size"])] for f in sorted(files, key=lambda f: f["path"])]
    return hashlib.sha256(json.dumps(canon).encode()).hexdigest()


def load_manifest_file(path: str) -> tuple[list[Any], str | None]:
    """The entries of a manifest file on the controller (a list, or a dict with ``files``), or a problem."""
    if not os.path.isabs(path):
        return [], (f"manifest_file {path!r} must be an absolute path on the controller "
                    "(e.g. '{{ inventory_dir }}/files/...')")
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        return [], (f"manifest_file {path} cannot be read on the controller: {exc.strerror or exc}; write it with "
                    "playbooks/model_manifest.yml (from the pinned hf revision or a local copy of the model)")
    except yaml.YAMLError as exc:
        return [], f"manifest_file {path} is not valid YAML/JSON: {exc}"
    if isinstance(data, Mapping):
        data = data.get("files")
    if not isinstance(data, list):
        return [], f"manifest_file {path} must hold a list of files (or a dict with files:)"
    return data, None


# A URL's user:password@ would be printed (loop labels, -v) and kept in the plan: refused.
_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@]*@")
_NO_URL_CREDENTIALS = ("a URL is printed and recorded, so it carries no credentials: serve the files from a mirror "
                       "that needs none (a private network), or use source sync")


def _without_userinfo(url: str) -> str:
    return _USERINFO.sub(lambda m: m.group(0).split("://")[0] + "://", url)


def _manifest(var: str, model: Mapping[str, Any], problems: list[str]) -> list[dict[str, Any]]:
    raw: Any = model.get("manifest") or []
    if not raw and model.get("manifest_file"):
        raw, problem = load_manifest_file(str(model["manifest_file"]))
        if problem:
            problems.append(f"{var}.{problem}")
    if isinstance(raw, Mapping):
        raw = raw.get("files") or []
    if not isinstance(raw, list):
        problems.append(f"{var}.manifest must be a list of {{path, sha256, size}}")
        raw = []
    base = str(model.get("http_base_url") or "").rstrip("/")
    files: list[dict[str, Any]] = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            problems.append(f"{var}: manifest entry {entry!r} must be a dict with path, sha256 and size")
            continue
        path = str(entry.get("path") or "")
        sha = str(entry.get("sha256") or "").lower()
        size = str(entry.get("size", ""))
        path_problem = manifest_path_problem(path)
        if path_problem:
            problems.append(f"{var}: {path_problem}")
        if not _SHA256.fullmatch(sha):
            problems.append(f"{var}: manifest entry {path} needs a sha256 of 64 hex digits")
        if not _SIZE.fullmatch(size):
            problems.append(f"{var}: manifest entry {path} needs a size in bytes")
        if _CONTROL.search(str(entry.get("url") or "")):
            problems.append(f"{var}: manifest entry {path} has a url with a control character: "
                            f"{json.dumps(str(entry.get('url')))}")
        elif _USERINFO.search(str(entry.get("url") or "")):
            problems.append(f"{var}: manifest entry {path} has a url with a user:password@ "
                            f"({_without_userinfo(str(entry.get('url')))}); {_NO_URL_CREDENTIALS}")
        files.append({
            "path": path,
            "sha256": sha,
            "size": int(size) if _SIZE.fullmatch(size) else 0,
            "url": str(entry.get("url") or f"{base}/{path}"),
            "own_url": bool(entry.get("url")),
        })
    paths = [f["path"] for f in files]
    for dup in sorted({p for p in paths if paths.count(p) > 1}):
        problems.append(f"{var}: manifest lists {dup} more than once")
    return sorted(files, key=lambda f: f["path"])


def _model(var: str, model: Any, models_dir: str, problems: list[str]) -> dict[str, Any]:
    if not isinstance(model, Mapping):
        problems.append(f"{var} must be a dict with name, source and manifest")
        model = {}
    name = str(model.get("name") or "")
    source = str(model.get("source") or "")
    files = _manifest(var, model, problems)
    if not _NAME.fullmatch(name):
        problems.append(f'{var}.name "{name}" must be a plain directory name (letters, digits, . _ -)')
    if source not in SOURCES:
        problems.append(f'{var}.source "{source}" must be hf, http or sync')
    if not files:
        problems.append(f"{var}: no manifest; set {var}.manifest (or .manifest_file) to the files with sha256 and size")
    if source == "hf" and not model.get("hf_repo_id"):
        problems.append(f"{var}.hf_repo_id is empty (source hf)")
    elif source == "hf" and not _REPO_ID.fullmatch(str(model.get("hf_repo_id"))):
        problems.append(f"{var}.hf_repo_id {json.dumps(str(model.get('hf_repo_id')))} must be <org>/<model> "
                        "(letters, digits, . _ -, not starting with - or .)")
    if source == "hf" and not _COMMIT.fullmatch(str(model.get("hf_revision") or "")):
        problems.append(f'{var}.hf_revision must pin a commit (40 hex digits), not "{model.get("hf_revision") or ""}"')
    base = str(model.get("http_base_url") or "")
    if _CONTROL.search(base):
        problems.append(f"{var}.http_base_url {json.dumps(base)} holds a control character")
    elif _USERINFO.search(base):
        problems.append(f"{var}.http_base_url {json.dumps(_without_userinfo(base))} carries a user:password@; "
                        f"{_NO_URL_CREDENTIALS}")
    if source == "http" and not model.get("http_base_url") and not all(f["own_url"] for f in files):
        problems.append(f"{var}.http_base_url is empty and not every manifest entry has its own url (source http)")
    sync_src = str(model.get("sync_src") or "")
    if source == "sync" and not sync_src:
        problems.append(f"{var}.sync_src is empty (source sync)")
    elif source == "sync" and (not sync_src.startswith("/") or _CONTROL.search(sync_src)):
        problems.append(f"{var}.sync_src {json.dumps(sync_src)} must be an absolute path without control characters")
    elif source == "sync" and not model.get("sync_remote_src", False):
        # The files are copied from the controller: a symbolic link in the model directory pointing
        # elsewhere (an SSH key, /etc/shadow) would ship that file to every host. The host's own
        # directory (sync_remote_src) is checked on the host before the copy (tasks/contained.yml).
        checked = [f["path"] for f in files if not manifest_path_problem(f["path"])]
        for bad in models_escapes(sync_src, checked):
            problems.append(f'{var}: manifest file "{bad["path"]}" resolves to {bad["real"]} on the controller, '
                            f"outside {var}.sync_src {sync_src} (a symbolic link): model files must lie inside "
                            "their model directory; put the file itself there, or fix the manifest")
    digest = manifest_sha256(files)
    revision = f"{name}-{digest[:12]}"
    return {
        "var": var,
        "name": name,
        "source": source,
        "manifest_sha256": digest,
        "manifest12": digest[:12],
        "path": f"{models_dir}/.store/{revision}",
        "staging": f"{models_dir}/.staging/{revision}",
        "files": [{k: v for k, v in f.items() if k != "own_url"} for f in files],
        "total_size": sum(f["size"] for f in files),
        "hf_repo_id": str(model.get("hf_repo_id") or ""),
        "hf_revision": str(model.get("hf_revision") or ""),
        "sync_src": str(model.get("sync_src") or "").rstrip("/"),
        "sync_remote_src": bool(model.get("sync_remote_src", False)),
    }


def models_plan(main: Any, draft: Any, models_dir: str) -> dict[str, Any]:
    """The models this run manages (the draft is ``None`` when disabled) and every input problem.

    ``paths`` maps ``models_main``/``models_draft`` to the versioned store path ("" for a disabled
    draft); ``release`` maps each model name to its manifest hash's first 12 hex digits.
    """
    models_dir = str(models_dir or "").rstrip("/") or str(models_dir or "")
    problems: list[str] = []
    if not models_dir.startswith("/") or _CONTROL.search(models_dir):
        problems.append(f'models_dir {json.dumps(models_dir)} must be an absolute path (without control characters)')
    wanted = [("models_main", main)] + ([("models_draft", draft)] if draft is not None else [])
    models = [_model(var, model, models_dir, problems) for var, model in wanted]
    names = [m["name"] for m in models]
    if len(set(names)) != len(names):
        problems.append("models_main.name and models_draft.name must differ")
    paths = {"models_main": "", "models_draft": ""}
    paths.update({m["var"]: m["path"] for m in models})
    return {
        "models": models,
        "problems": problems,
        "paths": paths,
        "release": {m["name"]: m["manifest12"] for m in models},
    }


_GET_URL_CHECKSUM = re.compile(r"The checksum for .* did not match (?:sha256:)?([0-9a-f]{64}); it was ([0-9a-f]{64})")


def models_fetch_errors(results: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """``{path: why}`` for the failed items of a registered fetch loop (item = manifest entry).

    ``get_url`` with ``checksum:`` removes a download whose sha256 differs and says so; that is
    rephrased like a staged file's mismatch. Other failures (HTTP 404, a timeout) keep their message.
    """
    errors = {}
    for result in results:
        if not result.get("failed"):
            continue
        entry = result.get("item") or {}
        msg = str(result.get("msg") or "failed")
        match = _GET_URL_CHECKSUM.search(msg)
        if match:
            msg = (f"sha256 {match.group(2)} (the download, removed by get_url), manifest says {match.group(1)} "
                   f"({entry.get('size')} bytes)")
        errors[str(entry.get("path", "?"))] = msg
    return errors


def models_file_problems(
    results: Sequence[Mapping[str, Any]], check_sha256: bool = True, fetch_errors: Mapping[str, str] | None = None
) -> list[dict[str, str]]:
    """The files of a registered ``stat`` loop (item = manifest entry) that do not match the manifest.

    Sizes are always compared; sha256 only with ``check_sha256`` (the stat ran with get_checksum).
    Skipped items (no ``stat``) are ignored. A missing file whose fetch failed (``fetch_errors``,
    from ``models_fetch_errors``) is reported with the fetch's reason.
    """
    bad: list[dict[str, str]] = []
    fetch_errors = fetch_errors or {}
    for result in results:
        stat, entry = result.get("stat"), result.get("item") or {}
        if stat is None:
            continue
        path = entry.get("path", "?")
        got = f"sha256 {stat.get('checksum')} ({stat.get('size')} bytes)"
        want = f"manifest says {entry.get('sha256')} ({entry.get('size')} bytes)"
        if not stat.get("exists") and path in fetch_errors:
            bad.append({"path": path, "msg": f"{path}: {fetch_errors[path]}"})
        elif not stat.get("exists"):
            bad.append({"path": path, "msg": f"{path} is missing"})
        elif check_sha256 and stat.get("checksum") != entry.get("sha256"):
            bad.append({"path": path, "msg": f"{path}: {got}, {want}"})
        elif int(stat.get("size", -1)) != int(entry.get("size", -2)):
            bad.append({"path": path, "msg": f"{path}: {stat.get('size')} bytes, manifest says {entry.get('size')}"})
    return bad


def _norm(path: str) -> str:
    return posixpath.normpath(str(path)) if path else ""


def models_manifest_from_hf_tree(entries: Any, repo_id: str = "", revision: str = "") -> dict[str, Any]:
    """A manifest from the Hub's tree API (``/api/models/<repo>/tree/<revision>?recursive=true``).

    LFS files carry their sha256 in ``lfs.oid``; the other files' ``oid`` is a git blob sha1, so they
    are listed in ``to_hash`` ({path, size}) for the caller to download and hash. ``problems`` names
    what makes the listing unusable (not a list, no files, an entry without path or size).
    """
    files: list[dict[str, Any]] = []
    to_hash: list[dict[str, Any]] = []
    problems: list[str] = []
    where = f"{repo_id}@{revision}" if repo_id else "the tree listing"
    if not isinstance(entries, list):
        return {"files": [], "to_hash": [], "problems": [f"{where}: the tree API did not answer with a list"]}
    for item in entries:
        if not isinstance(item, Mapping) or item.get("type") != "file":
            continue
        path, size, lfs = item.get("path"), item.get("size"), item.get("lfs")
        if not path or not isinstance(size, int):
            problems.append(f"{where}: tree entry {item!r} has no path or size")
            continue
        if isinstance(lfs, Mapping) and _SHA256.fullmatch(str(lfs.get("oid", ""))):
            files.append({"path": str(path), "sha256": str(lfs["oid"]), "size": int(lfs.get("size", size))})
        else:
            to_hash.append({"path": str(path), "size": size})
    if not files and not to_hash:
        problems.append(f"{where}: the tree lists no files")
    return {"files": sorted(files, key=lambda f: f["path"]), "to_hash": sorted(to_hash, key=lambda f: f["path"]),
            "problems": problems}


def models_manifest_from_find(
    found: Sequence[Mapping[str, Any]], root: str, include_hidden: bool = False
) -> list[dict[str, Any]]:
    """A manifest from a registered ``find`` (files, ``get_checksum`` with sha256) under ``root``.

    Paths are relative to ``root``; hidden files and files in hidden directories (``.cache/`` of a
    Hub download, the role's own marker) are left out unless ``include_hidden``.
    """
    base = _norm(root).rstrip("/") + "/"
    out = []
    for item in found:
        path = _norm(str(item.get("path", "")))
        if not path.startswith(base):
            continue
        rel = path[len(base):]
        if not include_hidden and any(part.startswith(".") for part in rel.split("/")):
            continue
        out.append({"path": rel, "sha256": str(item.get("checksum", "")), "size": int(item.get("size", 0))})
    return sorted(out, key=lambda f: f["path"])


def models_manifest_from_stats(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Manifest entries from a registered ``stat`` loop (sha256 checksums) whose item has the ``path``."""
    return [{"path": str((r.get("item") or {}).get("path")), "sha256": str(r["stat"].get("checksum", "")),
             "size": int(r["stat"].get("size", 0))} for r in results if r.get("stat", {}).get("exists")]


def models_hf_env(endpoint: str, token: str, token_file: Any) -> dict[str, Any]:
    """hf's environment: no telemetry or progress bars, HF_ENDPOINT when an endpoint is set and
    HF_TOKEN_PATH (the token's file) when a token is."""
    env: dict[str, Any] = {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    if len(endpoint) > 0:
        env["HF_ENDPOINT"] = endpoint
    if len(token) > 0:
        env["HF_TOKEN_PATH"] = token_file
    return env


class FilterModule:
    """Jinja filters of the models role."""

    def filters(self) -> dict[str, Any]:
        return {
            "models_plan": models_plan,
            "models_hf_env": models_hf_env,
            "models_file_problems": models_file_problems,
            "models_fetch_errors": models_fetch_errors,
            "models_manifest_from_hf_tree": models_manifest_from_hf_tree,
            "models_manifest_from_find": models_manifest_from_find,
            "models_manifest_from_stats": models_manifest_from_stats,
            "models_manifest_hash": manifest_sha256,
            "models_escapes": models_escapes,
            "models_resolved_outside": models_resolved_outside,
            "models_realpath_argv": models_realpath_argv,
            "models_hf_argv": models_hf_argv,
            "models_requirements_pin": models_requirements_pin,
        }
