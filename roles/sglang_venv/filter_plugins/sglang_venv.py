"""Filters of the sglang_venv role: what a probe said, what names a release, what pip is told.

Plain functions (testable without Ansible) exposed as Jinja filters. Each takes the registered result
or the role's facts as they are and does the branching the task files used to do inline:

- ``sglang_venv_capture_error(result)``: why venv_capture.py verify-archive refused a capture: the
  ``message`` of its JSON report, or its stderr when it printed none.
- ``sglang_venv_python_version(probe)``: ``{full, xy}`` of the interpreter probe, or
  ``{'full': 'missing', 'xy': '0.0'}`` when the probe failed.
- ``sglang_venv_probe_note(probe)``: `` (<stderr>)`` after the version of a failed probe, else ``""``.
- ``sglang_venv_release_spec(set_spec, captured, capture_summary, offline, require_hashes)``: what
  the release's package hash covers (the capture's archive, or the package set's inputs).
- ``sglang_venv_release_name(hash, sglang_version, package_set, captured, capture_summary)``: the
  derived release name ``<sglang>-<set or capture-name>-<hash[:12]>``.
- ``sglang_venv_link_target(stat)``: where a ``current``/``previous`` link points, ``""`` if none.
- ``sglang_venv_marker_hash(marker, marker_stat)``: the package hash recorded in a release, ``""``
  when it has no marker.
- ``sglang_venv_build_plan(steps, release, path, python, offline, wheelhouse_dir)``: check mode's
  sentence of what it would build.
- ``sglang_venv_step_argv(step, pip_install, offline, constraints, release_path)``: pip's argv for one
  install step.
- ``sglang_venv_lock_index_args(steps, offline)``: the ``--extra-index-url=`` words of the
  hash-checking install (every step's index, once).
- ``sglang_venv_switch_links(current_target, release_path)``: the links a switch writes, in order.
- ``sglang_venv_kept(newest, keep, keep_releases)``: the releases prune keeps by name or by age.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain-Python use (unit tests without Ansible)
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]

_NO_PYTHON = {"full": "missing", "xy": "0.0"}


def _json(text: Any) -> Any:
    try:
        return json.loads(str(text))
    except ValueError as err:
        raise AnsibleFilterError(f"not JSON: {err}") from err


def capture_error(result: Mapping[str, Any]) -> Any:
    """The refusal of verify-archive: its JSON report's message (a report starts with '{'), else stderr."""
    stdout = result["stdout"]
    if str(stdout).startswith("{"):
        return _json(stdout).get("message", "")
    return str(result["stderr"]).strip()


def python_version(probe: Mapping[str, Any]) -> Any:
    """The probe's ``{full, xy}`` when it ran (rc 0), else ``{'full': 'missing', 'xy': '0.0'}``."""
    if probe.get("rc") == 0:
        return _json(probe["stdout"])
    return dict(_NO_PYTHON)


def probe_note(probe: Mapping[str, Any]) -> str:
    """`` (<stderr, trimmed>)`` for a probe that failed (rc not 0), ``""`` for one that ran."""
    if probe.get("rc") != 0:
        return " (" + str(probe.get("stderr", "")).strip() + ")"
    return ""


_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@")


def url_public(url: Any) -> Any:
    """An index URL without its user:password@ (a record, a fact and the release's hash hold no
    credentials; pip still gets the URL as given)."""
    return _USERINFO.sub(r"\1", url) if isinstance(url, str) else url


def _public_urls(urls: Any) -> Any:
    if isinstance(urls, (list, tuple)):
        return [url_public(url) for url in urls]
    return url_public(urls)


def release_spec(
    set_spec: Mapping[str, Any],
    captured: bool,
    capture_summary: Mapping[str, Any],
    offline: bool,
    require_hashes: bool,
) -> dict[str, Any]:
    """What the release's package hash covers.

    A capture is named by its archive (bit for bit the same wherever it unpacks) and the host's
    Python: ``{capture: archive_sha256 or '', python}``. A package set by `set_spec` as given, with no
    index when it installs offline (``index_url ''``, ``extra_index_urls []``) and
    ``require_hashes: false`` when it does not install a lock (else the lock's lines, as given).
    """
    if captured:
        return {"capture": (capture_summary or {}).get("archive_sha256", ""), "python": set_spec["python"]}
    spec = dict(set_spec)
    # An index's credentials are not the release: left out of what is hashed and recorded
    # (.hicache-fleet-packages.json, 0644).
    for key in ("index_url", "extra_index_urls"):
        if key in spec:
            spec[key] = _public_urls(spec[key])
    if isinstance(spec.get("steps"), (list, tuple)):
        spec["steps"] = [
            {**step, **{key: _public_urls(step[key]) for key in ("index_url", "extra_index_url") if key in step}}
            if isinstance(step, Mapping) else step
            for step in spec["steps"]
        ]
    if offline:
        spec["index_url"] = ""
        spec["extra_index_urls"] = []
    if not require_hashes:
        spec["require_hashes"] = False
    return spec


def release_name(
    package_hash: str, sglang_version: Any, package_set: Any, captured: bool, capture_summary: Mapping[str, Any]
) -> str:
    """``<sglang version>-<package set, or capture-<capture name>>-<first 12 of the package hash>``."""
    kind = f"capture-{capture_summary['name']}" if captured else str(package_set)
    return f"{sglang_version}-{kind}-{str(package_hash)[:12]}"


def link_target(stat: Mapping[str, Any]) -> Any:
    """A stat result's lnk_target when the path is a link, else ``""``."""
    return stat["lnk_target"] if stat.get("islnk", False) else ""


def marker_hash(marker: Mapping[str, Any], marker_stat: Mapping[str, Any]) -> str:
    """The slurped marker's content (base64-decoded, trimmed) when the marker exists, else ``""``."""
    if not marker_stat["stat"]["exists"]:
        return ""
    return base64.b64decode(str(marker["content"]).encode()).decode("utf-8").strip()


def build_plan(
    steps: Sequence[Mapping[str, Any]], release: Any, path: Any, python: Any, offline: bool, wheelhouse_dir: Any
) -> str:
    """``Would build release R at P with Python X[ offline from the wheelhouse D]: [step[ --no-deps]: pkgs] ...``"""
    where = f" offline from the wheelhouse {wheelhouse_dir}" if offline else ""
    words = "".join(
        f"[{step['name']}{' --no-deps' if step['no_deps'] else ''}: {' '.join(str(p) for p in step['packages'])}] "
        for step in steps
    )
    return f"Would build release {release} at {path} with Python {python}{where}: {words}"


def _extra_index_args(urls: Sequence[Any]) -> list[str]:
    return [f"--extra-index-url={url}" for url in urls]


def step_argv(
    step: Mapping[str, Any],
    pip_install: Sequence[Any],
    offline: bool,
    constraints: Sequence[Any],
    release_path: str,
) -> list[Any]:
    """pip install argv of one normalized step.

    The shared pip words, ``--no-deps`` for a no_deps step, the step's own index (``--index-url``,
    ``--extra-index-url=`` each) unless the install is offline, ``-c <release>/.hicache-fleet-
    constraints.txt`` when the set has constraints, then the step's packages.
    """
    argv = list(pip_install)
    if step["no_deps"]:
        argv.append("--no-deps")
    if not offline:
        if step["index_url"]:
            argv += ["--index-url", step["index_url"]]
        argv += _extra_index_args(step["extra_index_url"])
    if len(constraints) > 0:
        argv += ["-c", f"{release_path}/.hicache-fleet-constraints.txt"]
    return argv + list(step["packages"])


def lock_index_args(steps: Sequence[Mapping[str, Any]], offline: bool) -> list[str]:
    """``--extra-index-url=<url>`` for every step's non-empty index_url, first occurrence kept.

    Duplicates compare case-insensitively, as Ansible's ``unique`` filter (Jinja's) does; none when
    offline.
    """
    if offline:
        return []
    seen: set[Any] = set()
    urls = []
    for url in (step["index_url"] for step in steps):
        if not url:
            continue
        key = url.lower() if isinstance(url, str) else url
        if key not in seen:
            seen.add(key)
            urls.append(url)
    return _extra_index_args(urls)


def switch_links(current_target: Any, release_path: Any) -> list[dict[str, Any]]:
    """``previous`` -> what current pointed to (when it pointed anywhere), then ``current`` -> the release."""
    links = [{"name": "previous", "target": current_target}] if current_target else []
    return [*links, {"name": "current", "target": release_path}]


def kept(newest: Sequence[Any], keep: Sequence[Any], keep_releases: Any) -> list[Any]:
    """The releases named in `keep` when it names any, else the `keep_releases` newest of `newest`."""
    if len(keep) > 0:
        return list(keep)
    return list(newest[: int(keep_releases)])


class FilterModule:
    """Jinja filters of the sglang_venv role."""

    def filters(self) -> dict[str, Any]:
        return {
            "sglang_venv_capture_error": capture_error,
            "sglang_venv_python_version": python_version,
            "sglang_venv_probe_note": probe_note,
            "sglang_venv_release_spec": release_spec,
            "sglang_venv_release_name": release_name,
            "sglang_venv_link_target": link_target,
            "sglang_venv_marker_hash": marker_hash,
            "sglang_venv_build_plan": build_plan,
            "sglang_venv_step_argv": step_argv,
            "sglang_venv_lock_index_args": lock_index_args,
            "sglang_venv_switch_links": switch_links,
            "sglang_venv_kept": kept,
        }
