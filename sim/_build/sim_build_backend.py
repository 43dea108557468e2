"""A minimal PEP 517 build backend (standard library only) for sglang-sim.

It lets ``pip wheel --no-deps --no-build-isolation ./sim`` and ``pip install ./sim`` work on a
host with no network and no setuptools/wheel: the wheel is a zip of the package, its data files
and a dist-info directory, written with zipfile. Metadata comes from pyproject.toml's [project].
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "sglang_sim"


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]


def _dist_name(project: dict) -> str:
    return project["name"].replace("-", "_")


def _metadata(project: dict) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '>=3.11')}",
    ]
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    readme = ROOT / project.get("readme", "README.md")
    body = readme.read_text() if readme.exists() else ""
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + body


def _entry_points(project: dict) -> str:
    scripts = project.get("scripts", {})
    if not scripts:
        return ""
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())


def _package_files() -> list[Path]:
    files = []
    for path in sorted((ROOT / PACKAGE).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".json"):
            files.append(path)
    return files


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, extra: dict[str, bytes], include_package: bool) -> str:
    project = _project()
    dist = _dist_name(project)
    version = project["version"]
    info = f"{dist}-{version}.dist-info"
    filename = f"{dist}-{version}-py3-none-any.whl"
    entries: dict[str, bytes] = {}
    if include_package:
        for path in _package_files():
            entries[path.relative_to(ROOT).as_posix()] = path.read_bytes()
    entries.update(extra)
    entries[f"{info}/METADATA"] = _metadata(project).encode()
    entries[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: sim_build_backend\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    entry_points = _entry_points(project)
    if entry_points:
        entries[f"{info}/entry_points.txt"] = entry_points.encode()
    entries[f"{info}/top_level.txt"] = f"{PACKAGE}\n".encode()
    record = [_record_line(name, data) for name, data in entries.items()]
    record.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(Path(wheel_directory) / filename, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            info_obj = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info_obj.external_attr = 0o644 << 16
            info_obj.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info_obj, data)
    return filename


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, {}, include_package=True)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    pth = f"{ROOT}\n".encode()
    return _write_wheel(wheel_directory, {f"__editable__.{PACKAGE}.pth": pth},
                        include_package=False)


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    base = f"{_dist_name(project)}-{project['version']}"
    filename = f"{base}.tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(Path(sdist_directory) / filename, "w:gz") as tar:
        paths = [ROOT / "pyproject.toml", ROOT / "README.md", *(ROOT / "_build").glob("*.py"),
                 *_package_files()]
        for path in paths:
            if path.exists():
                tar.add(path, arcname=f"{base}/{path.relative_to(ROOT).as_posix()}")
        pkg_info = _metadata(project).encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return filename
