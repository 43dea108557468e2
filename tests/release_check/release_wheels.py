"""Real wheels from the package index for the release check's tests, cached under .cache/wheels/.

Each wheel is fetched once with pip (the controller's own configuration, as `make lock` and the
wheelhouse playbook use it) and unpacked once, only the members a test reads. A wheel that cannot be
fetched fails the test that needs it, with pip's message: these tests exist to run on the real files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import ansible.module_utils
import pytest

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HICACHE_FLEET_CACHE") or REPO / ".cache") / "wheels"

# module_utils/ under the name Ansible gives it (ansible.cfg `module_utils`).
if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))

CP312 = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
         "--platform", "manylinux_2_34_x86_64", "--platform", "manylinux_2_28_x86_64"]


def fetch(requirement: str, target: tuple[str, ...] = ()) -> Path:
    """The wheel of `requirement` (name==version) in the cache, downloaded once."""
    name, version = requirement.split("==")
    prefix = f"{name.replace('-', '_')}-{version}-"
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob(prefix + "*.whl"))
    if not found:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
             "-d", str(CACHE), *target, requirement],
            capture_output=True, text=True, timeout=1800, check=False)
        found = sorted(CACHE.glob(prefix + "*.whl"))
        if not found:
            pytest.fail(f"pip download {requirement} gave no wheel: {(proc.stderr or proc.stdout)[-800:]}")
    return found[0]


def unpack(wheel: Path, members: tuple[str, ...]) -> Path:
    """`wheel`'s members under these prefixes, unpacked once beside it; the directory returned."""
    into = wheel.with_suffix(".d")
    stamp = into / ".unpacked"
    if stamp.exists() and stamp.read_text() == "\n".join(members):
        return into
    shutil.rmtree(into, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.filename.startswith(members):
                zf.extract(info, into)
    stamp.write_text("\n".join(members))
    return into


def make_venv(root: Path, kernel: Path | None = None, torch_lib: Path | None = None,
              sglang: Path | None = None, dists: dict[str, str] | None = None) -> Path:
    """A release directory laid out like a venv from real package files: the kernel copied (its
    RUNPATH is $ORIGIN/../../torch/lib), torch/lib, sglang/ linked, dist-info of `dists`."""
    site = root / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    if kernel is not None:
        shutil.copytree(kernel, site / "sgl_kernel")
    if torch_lib is not None:
        (site / "torch").mkdir()
        (site / "torch" / "lib").symlink_to(torch_lib, target_is_directory=True)
    if sglang is not None:
        (site / "sglang").symlink_to(sglang, target_is_directory=True)
    for name, version in (dists or {}).items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
        top = {"sglang-kernel-rdna3": "sgl_kernel", "sglang-kernel": "sgl_kernel"}.get(name, name.replace("-", "_"))
        (info / "top_level.txt").write_text(top + "\n")
    return root
