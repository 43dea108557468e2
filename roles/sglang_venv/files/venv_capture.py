#!/usr/bin/env python3
"""Captured venvs of roles/sglang_venv: a working venv packed by venv-pack, as a release.

Standard library only: it runs on the controller (``manifest``, ``verify-archive``) and on the hosts
(``unpack``) with their system Python.

    venv_capture.py manifest DIR --name N --source-host H --source-path P
        DIR/venv.tar (venv-pack's relocatable archive) -> DIR/manifest.json: the archive's sha256,
        every member (regular file: sha256, size, mode; symlink: its target), the distributions
        (name, version, the sha256 of every compiled extension they own) and the venv's Python.
    venv_capture.py verify-archive DIR
        The archive's sha256 and every member against the manifest; prints the manifest's summary
        as JSON. Exit 1 with the first differences when the capture is corrupt.
    venv_capture.py unpack ARCHIVE MANIFEST DEST
        Extract into DEST (which must not exist; members outside DEST, devices and hard links are
        refused), owned by root, then verify every file of the manifest on disk, bit for bit.
        Exit 1 (DEST removed) on any difference.

Every function is plain and tested in tests/venv/test_venv_capture.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import tarfile
import time
from collections.abc import Iterator, Mapping
from typing import IO, Any

FORMAT = 1
CHUNK = 1 << 20


class CaptureError(Exception):
    """The capture is not what its manifest says."""


def sha256_stream(handle: IO[bytes]) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for block in iter(lambda: handle.read(CHUNK), b""):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


def sha256_file(path: str) -> str:
    with open(path, "rb") as handle:
        return sha256_stream(handle)[0]


def _safe_name(name: str) -> str:
    norm = os.path.normpath(name)
    if name.startswith("/") or norm == ".." or norm.startswith("../"):
        raise CaptureError(f"archive member {name!r} points outside the venv")
    return norm


def archive_members(archive: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(path, entry)`` of every member of a venv archive, hashing regular files as it reads."""
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            name = _safe_name(member.name)
            if member.isdir():
                continue
            if member.issym():
                yield name, {"link": member.linkname}
            elif member.isfile():
                handle = tar.extractfile(member)
                assert handle is not None
                digest, size = sha256_stream(handle)
                yield name, {"sha256": digest, "size": size, "mode": f"{stat.S_IMODE(member.mode):04o}"}
            else:
                raise CaptureError(f"archive member {name!r} is neither a file, a directory nor a symlink")


def _metadata(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        if key in ("Name", "Version"):
            fields[key.lower()] = value.strip()
    return fields


def distributions(archive: str, files: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each ``*.dist-info`` of the archive: name, version, and the sha256 of every compiled extension
    its RECORD lists (paths relative to the venv)."""
    out = []
    with tarfile.open(archive, "r:*") as tar:
        names = {_safe_name(m.name): m for m in tar.getmembers()}
        for path in sorted(p for p in names if p.endswith(".dist-info/METADATA")):
            info_dir = os.path.dirname(path)
            site = os.path.dirname(info_dir)
            meta = tar.extractfile(names[path])
            fields = _metadata(meta.read().decode("utf-8", "replace")) if meta else {}
            record = names.get(f"{info_dir}/RECORD")
            owned: list[str] = []
            if record is not None:
                handle = tar.extractfile(record)
                text = handle.read().decode("utf-8", "replace") if handle else ""
                owned = [os.path.normpath(os.path.join(site, line.split(",")[0])) for line in text.splitlines()
                         if line.strip()]
            extensions = {p: files[p]["sha256"] for p in sorted(owned)
                          if (p.endswith(".so") or ".so." in os.path.basename(p)) and "sha256" in files.get(p, {})}
            out.append({"name": fields.get("name", os.path.basename(info_dir)), "version": fields.get("version", ""),
                        "extensions": extensions})
    return out


def pyvenv_python(archive: str) -> str:
    """The Python version of the venv (pyvenv.cfg's `version`/`version_info`)."""
    with tarfile.open(archive, "r:*") as tar:
        try:
            handle = tar.extractfile("pyvenv.cfg")
        except KeyError:
            raise CaptureError("the archive has no pyvenv.cfg: not a venv packed by venv-pack") from None
        text = handle.read().decode() if handle else ""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version", "version_info"):
            return value.strip()
    return ""


def make_manifest(directory: str, name: str, source_host: str, source_path: str) -> dict[str, Any]:
    archive = os.path.join(directory, "venv.tar")
    with open(archive, "rb") as handle:
        archive_sha, archive_size = sha256_stream(handle)
    files = dict(archive_members(archive))
    dists = distributions(archive, files)
    sglang = next((d["version"] for d in dists if d["name"].lower() == "sglang"), "")
    return {"format": FORMAT, "name": name, "archive": "venv.tar", "archive_sha256": archive_sha,
            "archive_size": archive_size, "python": pyvenv_python(archive), "sglang_version": sglang,
            "source": {"host": source_host, "path": source_path,
                       "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "files": files, "distributions": dists}


def summary(manifest: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("name", "archive_sha256", "archive_size", "python", "sglang_version", "source")
    return {k: manifest[k] for k in keys} | {"files": len(manifest["files"]),
                                             "distributions": len(manifest["distributions"])}


def load_manifest(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError) as exc:
        raise CaptureError(f"cannot read the manifest {path}: {exc}") from exc
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not (isinstance(files, dict) and manifest.get("format") == FORMAT):
        raise CaptureError(f"{path} is not a capture manifest (format {FORMAT}); capture the venv again")
    return manifest


def verify_archive(directory: str) -> dict[str, Any]:
    """The manifest's summary when the archive is what it lists; CaptureError naming what differs."""
    manifest = load_manifest(os.path.join(directory, "manifest.json"))
    archive = os.path.join(directory, manifest.get("archive", "venv.tar"))
    try:
        with open(archive, "rb") as handle:
            digest, _ = sha256_stream(handle)
    except OSError as exc:
        raise CaptureError(f"cannot read the capture's archive {archive}: {exc.strerror}") from exc
    if digest != manifest["archive_sha256"]:
        raise CaptureError(f"{archive} has sha256 {digest}, the manifest says {manifest['archive_sha256']}: "
                           "the capture is corrupt or was changed after it was taken; capture the venv again")
    try:
        members = dict(archive_members(archive))
    except (tarfile.TarError, OSError) as exc:
        raise CaptureError(f"{archive} is not a readable archive: {exc}") from exc
    if members != manifest["files"]:
        changed = {p for p in members if members[p] != manifest["files"].get(p)}
        differ = sorted(set(members) ^ set(manifest["files"]) | changed)
        raise CaptureError(f"{archive} does not hold what its manifest lists ({len(differ)} path(s), first: "
                           f"{', '.join(differ[:3])}); capture the venv again")
    return summary(manifest)


def tree_differences(root: str, files: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every listed path of ``root`` that is missing or not bit for bit what the manifest says."""
    out = []
    for path, entry in sorted(files.items()):
        full = os.path.join(root, path)
        if "link" in entry:
            if not os.path.islink(full) or os.readlink(full) != entry["link"]:
                out.append(f"{path}: not a symlink to {entry['link']}")
            elif os.path.isabs(entry["link"]) and not os.path.exists(full):
                out.append(f"{path} -> {entry['link']}, which this host does not have (capture from a host with "
                           "the same OS and Python)")
            continue
        if os.path.islink(full) or not os.path.isfile(full):
            out.append(f"{path}: missing")
        elif sha256_file(full) != entry["sha256"]:
            out.append(f"{path}: sha256 differs")
    return out


def unpack(archive: str, manifest_path: str, dest: str) -> dict[str, Any]:
    manifest = load_manifest(manifest_path)
    with open(archive, "rb") as handle:
        digest, _ = sha256_stream(handle)
    if digest != manifest["archive_sha256"]:
        raise CaptureError(f"{archive} has sha256 {digest}, the manifest says {manifest['archive_sha256']}: "
                           "the copy on this host is corrupt")
    if os.path.lexists(dest):
        raise CaptureError(f"{dest} exists already")
    os.makedirs(dest, mode=0o755)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = []
            for member in tar.getmembers():
                _safe_name(member.name)
                if not (member.isdir() or member.isfile() or member.issym()):
                    raise CaptureError(f"archive member {member.name!r} is neither a file, a directory nor a symlink")
                member.uid = member.gid = 0
                member.uname = member.gname = "root"
                members.append(member)
            kwargs = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
            tar.extractall(dest, members=members, numeric_owner=True, **kwargs)  # noqa: S202 (members checked)
        differences = tree_differences(dest, manifest["files"])
        if differences:
            raise CaptureError(f"{len(differences)} file(s) differ after unpacking into {dest}: "
                               + "; ".join(differences[:5]))
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return summary(manifest)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("manifest")
    m.add_argument("directory")
    m.add_argument("--name", required=True)
    m.add_argument("--source-host", required=True)
    m.add_argument("--source-path", required=True)
    v = sub.add_parser("verify-archive")
    v.add_argument("directory")
    u = sub.add_parser("unpack")
    u.add_argument("archive")
    u.add_argument("manifest")
    u.add_argument("dest")
    args = parser.parse_args(argv)
    try:
        if args.command == "manifest":
            manifest = make_manifest(args.directory, args.name, args.source_host, args.source_path)
            path = os.path.join(args.directory, "manifest.json")
            with open(path + ".partial", "w", encoding="utf-8") as handle:
                json.dump(manifest, handle, indent=1, sort_keys=True)
            os.replace(path + ".partial", path)
            with open(os.path.join(args.directory, "SHA256SUMS"), "w", encoding="utf-8") as handle:
                handle.write(f"{manifest['archive_sha256']}  venv.tar\n{sha256_file(path)}  manifest.json\n")
            result = summary(manifest)
        elif args.command == "verify-archive":
            result = verify_archive(args.directory)
        else:
            result = unpack(args.archive, args.manifest, args.dest)
    except (CaptureError, tarfile.TarError, OSError) as exc:
        print(json.dumps({"ok": False, "message": str(exc)}))
        return 1
    print(json.dumps({"ok": True, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
