"""Captured venvs (roles/sglang_venv/files/venv_capture.py) on a real venv packed by the real
venv-pack: the manifest lists every file and each distribution's compiled extensions; the archive
verifies; a flipped byte, a changed manifest or a member outside the venv is refused; unpacking
gives the files bit for bit, or nothing."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from plugins import ROOT, load

cap = load("roles/sglang_venv/files/venv_capture.py")
SCRIPT = ROOT / "roles/sglang_venv/files/venv_capture.py"


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    """A real venv (python -m venv, pip's own wheel installed into it) packed by venv-pack."""
    work = tmp_path_factory.mktemp("capture")
    venv = work / "source-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # A distribution with a compiled extension (markupsafe's _speedups), from the package index.
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--only-binary", ":all:",
                    "markupsafe==3.0.3"], check=True, timeout=600)
    store = work / "store" / "ref-1"
    store.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "venv_pack", "--prefix", str(venv), "--output", str(store / "venv.tar"),
                    "--format", "tar", "--exclude", ".hicache-fleet-*"], check=True, timeout=600)
    out = subprocess.run([sys.executable, str(SCRIPT), "manifest", str(store), "--name", "ref-1",
                          "--source-host", "ref", "--source-path", str(venv)],
                         capture_output=True, text=True, check=True, timeout=600)
    assert json.loads(out.stdout)["ok"] is True
    return store


def run(*args: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    return proc.returncode, json.loads(proc.stdout)


def test_manifest_lists_every_file_and_the_extensions(capture):
    manifest = json.loads((capture / "manifest.json").read_text())
    with tarfile.open(capture / "venv.tar") as tar:
        files = {os.path.normpath(m.name) for m in tar.getmembers() if not m.isdir()}
    assert set(manifest["files"]) == files
    assert "link" in manifest["files"]["bin/python"]
    # The venv's interpreter link chain ends in the system Python by an absolute path (venv's way).
    assert any(e.get("link", "").startswith("/") for p, e in manifest["files"].items() if p.startswith("bin/"))
    assert manifest["python"].split(".")[:2] == [str(sys.version_info[0]), str(sys.version_info[1])]
    [markupsafe] = [d for d in manifest["distributions"] if d["name"].lower() == "markupsafe"]
    assert markupsafe["version"] == "3.0.3"
    [(so, digest)] = markupsafe["extensions"].items()
    assert so.endswith(".so") and digest == manifest["files"][so]["sha256"]
    assert (capture / "SHA256SUMS").read_text().startswith(f"{manifest['archive_sha256']}  venv.tar\n")


def test_the_archive_verifies(capture):
    rc, out = run("verify-archive", str(capture))
    assert rc == 0, out
    assert out["name"] == "ref-1" and out["files"] > 100


def test_a_flipped_byte_is_refused(capture, tmp_path):
    bad = tmp_path / "ref-1"
    bad.mkdir()
    (bad / "manifest.json").write_bytes((capture / "manifest.json").read_bytes())
    data = bytearray((capture / "venv.tar").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad / "venv.tar").write_bytes(bytes(data))
    rc, out = run("verify-archive", str(bad))
    assert rc == 1
    assert "the capture is corrupt or was changed after it was taken" in out["message"]


def test_a_manifest_that_lies_about_a_file_is_refused(capture, tmp_path):
    bad = tmp_path / "ref-1"
    bad.mkdir()
    manifest = json.loads((capture / "manifest.json").read_text())
    path = next(p for p, e in sorted(manifest["files"].items()) if "sha256" in e)
    manifest["files"][path]["sha256"] = "0" * 64
    (bad / "manifest.json").write_text(json.dumps(manifest))
    (bad / "venv.tar").symlink_to(capture / "venv.tar")
    rc, out = run("verify-archive", str(bad))
    assert rc == 1
    assert "does not hold what its manifest lists (1 path(s), first: " + path in out["message"]


def test_unpack_gives_every_file_bit_for_bit(capture, tmp_path):
    dest = tmp_path / "venvs" / "release"
    rc, out = run("unpack", str(capture / "venv.tar"), str(capture / "manifest.json"), str(dest))
    assert rc == 0, out
    manifest = json.loads((capture / "manifest.json").read_text())
    for path, entry in manifest["files"].items():
        if "sha256" in entry:
            assert cap.sha256_file(str(dest / path)) == entry["sha256"], path
    assert cap.tree_differences(str(dest), manifest["files"]) == []
    # The unpacked venv runs: its python imports the captured extension.
    done = subprocess.run([str(dest / "bin/python"), "-c", "import markupsafe._speedups as s; print(s.__file__)"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(dest))
    # A changed file afterwards is named.
    victim = next(p for p, e in sorted(manifest["files"].items()) if e.get("sha256") and p.endswith(".py"))
    (dest / victim).write_text("# changed\n")
    assert cap.tree_differences(str(dest), manifest["files"]) == [f"{victim}: sha256 differs"]


def test_unpack_of_a_corrupt_copy_leaves_nothing(capture, tmp_path):
    data = bytearray((capture / "venv.tar").read_bytes())
    data[-2048] ^= 0x01
    archive = tmp_path / "venv.tar"
    archive.write_bytes(bytes(data))
    dest = tmp_path / "release"
    rc, out = run("unpack", str(archive), str(capture / "manifest.json"), str(dest))
    assert rc == 1 and "the copy on this host is corrupt" in out["message"]
    assert not dest.exists()


def test_a_member_outside_the_venv_is_refused(tmp_path):
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("../../etc/evil")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    with pytest.raises(cap.CaptureError, match="points outside the venv"):
        dict(cap.archive_members(str(archive)))
