"""Filters of the rocm role: the desired ROCm release as data, its id, and what activating it changes.

A release is a small dict computed on the controller from the inventory:
  distro: {"source": "distro", "packages": {"rocminfo": None, "librocm-smi-dev": "5.2.3-2"}}
  amd:    {"source": "amd", "version": "7.1.1", "amdgpu_version": "30.20.1", "suite": "noble",
           "repositories": [...], "driver": ["amdgpu-dkms"], "packages": {"amdgpu-dkms": None, "rocm": None}}
A package's version None means "any version the source offers" (distro: whatever is installed is
kept; amd: the version of the pinned repository, so a repository change is an upgrade or a downgrade).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain pytest without ansible-core on the path
    AnsibleFilterError = ValueError  # type: ignore[assignment,misc]

_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")


def rocm_package_specs(specs: list[str], variable: str = "rocm_distro_packages") -> dict[str, str | None]:
    """`name` or `name=version` (apt's syntax) → {name: version or None}."""
    packages: dict[str, str | None] = {}
    for spec in specs or []:
        name, sep, version = str(spec).strip().partition("=")
        name, version = name.strip(), version.strip()
        if not _NAME.match(name) or (sep and not version):
            raise AnsibleFilterError(
                f"{variable}: {spec!r} is not a Debian package name or name=version (e.g. rocminfo=5.2.3-2)"
            )
        if name in packages:
            raise AnsibleFilterError(f"{variable}: {name} is listed twice")
        packages[name] = version or None
    return packages


def rocm_repositories(repositories: list[dict[str, Any]], suite: str) -> list[dict[str, Any]]:
    """rocm_amd_repositories with every field filled in (suite, components), as a release records them."""
    return [
        {
            "name": repo["name"],
            "uris": repo["uris"],
            "suites": repo.get("suites") or suite,
            "components": list(repo.get("components") or ["main"]),
        }
        for repo in repositories or []
    ]


def rocm_release_id(release: dict[str, Any]) -> str:
    """Short stable id of a release: sha256 of its canonical JSON, 12 hex digits."""
    canonical = json.dumps(release, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def rocm_installed(stdout: str) -> dict[str, str]:
    """dpkg-query -W -f='${Package}\\t${db:Status-Abbrev}\\t${Version}\\n' → {name: version} of installed ones."""
    installed: dict[str, str] = {}
    for line in (stdout or "").splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[1].startswith("ii"):
            installed[parts[0].split(":")[0]] = parts[2].strip()
    return installed


def rocm_offered(stdout: str, uris: list[str] | None = None) -> dict[str, list[str]]:
    """apt-cache madison output → {name: [versions, best first]}; only from `uris` when given."""
    offered: dict[str, list[str]] = {}
    prefixes = [u.rstrip("/") for u in uris or []]
    for line in (stdout or "").splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < 3:
            continue
        name, version, source = parts[0], parts[1], parts[2]
        if prefixes and not any(source.startswith(p + "/") or source.startswith(p + " ") for p in prefixes):
            continue
        versions = offered.setdefault(name, [])
        if version not in versions:
            versions.append(version)
    return offered


def rocm_wanted(release: dict[str, Any], offered: dict[str, list[str]]) -> dict[str, str | None]:
    """Each package's wanted version: the pinned one; for the amd source an unpinned package takes the
    version its (pinned) repository offers. None: any installed version will do (distro)."""
    wanted: dict[str, str | None] = {}
    for name, version in (release.get("packages") or {}).items():
        if version is None and release.get("source") == "amd":
            version = (offered.get(name) or [None])[0]
        wanted[name] = version
    return wanted


def rocm_changes(wanted: dict[str, str | None], installed: dict[str, str]) -> dict[str, str | None]:
    """The packages activating the release installs or moves to another version (and the version)."""
    return {
        name: version
        for name, version in sorted(wanted.items())
        if installed.get(name) is None or (version is not None and version != installed[name])
    }


def rocm_activation_plan(wanted: dict[str, str | None], installed: dict[str, str]) -> list[str]:
    """What activating the release changes, one line per package; empty: nothing to activate."""
    return [
        f"{name}: install {version or 'the archive version'}" if name not in installed
        else f"{name}: {installed[name]} -> {version}"
        for name, version in rocm_changes(wanted, installed).items()
    ]


def rocm_unavailable(wanted: dict[str, str | None], installed: dict[str, str],
                     offered: dict[str, list[str]]) -> list[str]:
    """Packages whose wanted version apt cannot install: neither installed at it nor in the archive."""
    missing = []
    for name, version in sorted(wanted.items()):
        if installed.get(name) is not None and (version is None or installed[name] == version):
            continue
        if version is None and not offered.get(name):
            missing.append(name)
        elif version is not None and version not in offered.get(name, []):
            missing.append(name)
    return missing


def rocm_unavailable_notes(missing: list[str], wanted: dict[str, str | None], installed: dict[str, str],
                           offered: dict[str, list[str]]) -> list[str]:
    """One sentence per package apt cannot bring to the wanted version: what stays and why."""
    notes = []
    for name in missing:
        want = f"{name}={wanted[name]}" if wanted.get(name) else name
        offer = ", ".join(offered.get(name, [])) or "none"
        stays = f"{installed[name]} stays installed" if name in installed else "it stays uninstalled"
        notes.append(f"{want}: apt cannot install it (versions offered: {offer}); {stays}")
    return notes


def rocm_apt_names(wanted: dict[str, str | None], only: list[str] | None = None,
                   skip: list[str] | None = None) -> list[str]:
    """apt names (`name` or `name=version`), only of the `only` packages when given, without the `skip` ones."""
    return [
        name if version is None else f"{name}={version}"
        for name, version in sorted(wanted.items())
        if (only is None or name in only) and name not in (skip or [])
    ]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "rocm_package_specs": rocm_package_specs,
            "rocm_repositories": rocm_repositories,
            "rocm_release_id": rocm_release_id,
            "rocm_installed": rocm_installed,
            "rocm_offered": rocm_offered,
            "rocm_wanted": rocm_wanted,
            "rocm_changes": rocm_changes,
            "rocm_activation_plan": rocm_activation_plan,
            "rocm_unavailable": rocm_unavailable,
            "rocm_unavailable_notes": rocm_unavailable_notes,
            "rocm_apt_names": rocm_apt_names,
        }
