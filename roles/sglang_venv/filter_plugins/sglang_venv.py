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
- ``sglang_venv_normalize_steps(set_steps, extra_packages, extra_no_deps)``: the set's steps (and the
  extra packages) as ``{name, packages, no_deps, index_url, extra_index_url}``, URLs as given.
- ``sglang_venv_steps_public(steps)``, ``sglang_venv_url_public(url)``, ``sglang_venv_sets_public(sets)``:
  the same without any index URL's user:password@.
- ``sglang_venv_index_auth(steps, index_url, extra_index_urls, package_set)``: the index URLs'
  credentials as a netrc file's text for pip (``NETRC``), and the variables that cannot be given so.
- ``sglang_venv_switch_links(current_target, release_path)``: the links a switch writes, in order.
- ``sglang_venv_kept(newest, keep, keep_releases)``: the releases prune keeps by name or by age.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

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


_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)([^/?#]*)(.*)$", re.S)


def _split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """``(url without user:password@, user, password)``, user and password percent-decoded as pip
    decodes them (``p%40ss`` is ``p@ss``); ``None`` for what the URL does not carry."""
    match = _URL.match(url)
    if not match or "@" not in match.group(2):
        return url, None, None
    userinfo, _, host = match.group(2).rpartition("@")
    user, colon, password = userinfo.partition(":")
    return match.group(1) + host + match.group(3), unquote(user), unquote(password) if colon else None


def url_public(url: Any) -> Any:
    """An index URL without its user:password@: what pip's argv, a record, a fact and the release's
    hash hold. The credentials reach pip through a netrc file (``index_auth``)."""
    return _split_userinfo(url)[0] if isinstance(url, str) else url


def _public_urls(urls: Any) -> Any:
    if isinstance(urls, (list, tuple)):
        return [url_public(url) for url in urls]
    return url_public(urls)


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on", "y", "t")
    return bool(value)


def normalize_steps(set_steps: Sequence[Mapping[str, Any]], extra_packages: Sequence[Any],
                    extra_no_deps: Any) -> list[dict[str, Any]]:
    """The package set's steps, then ``extra packages`` (when any), each as
    ``{name, packages, no_deps, index_url, extra_index_url}``: a step without a name is ``step <n>``,
    ``extra_index_url`` a list of the non-empty URLs (one string is a list of one). URLs as given."""
    steps = list(set_steps)
    if len(extra_packages) > 0:
        steps.append({"name": "extra packages", "packages": list(extra_packages), "no_deps": extra_no_deps})
    out = []
    for number, step in enumerate(steps, start=1):
        extra = step.get("extra_index_url") or []
        extra = [extra] if isinstance(extra, str) else list(extra)
        index_url = step.get("index_url")
        out.append({
            "name": step.get("name") or f"step {number}",
            "packages": list(step.get("packages") or []),
            "no_deps": _as_bool(step.get("no_deps", False)),
            "index_url": "" if index_url is None else str(index_url),
            "extra_index_url": [url for url in extra if url],
        })
    return out


def steps_public(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Normalized steps with every index URL without its user:password@ (what the role keeps, prints
    and gives pip)."""
    return [{**step, "index_url": url_public(step["index_url"]),
             "extra_index_url": _public_urls(step["extra_index_url"])} for step in steps]


_NETRC_PLAIN = re.compile(r'[^\s"\\#]+')


def _netrc_word(text: str) -> str:
    """A netrc token: as it is when it is one plain word, else quoted with backslash escapes (Python's
    netrc, which pip's requests reads, takes both)."""
    if _NETRC_PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def index_auth(
    steps: Sequence[Mapping[str, Any]], index_url: Any, extra_index_urls: Sequence[Any], package_set: Any
) -> dict[str, Any]:
    """The credentials of the index URLs, for pip through a netrc file (``NETRC``), never its argv.

    ``{netrc, hosts, errors}``: ``netrc`` the file's text (``machine <host> login <user> password
    <password>``, a word with a space, quote, backslash or ``#`` quoted; empty when no URL carries
    credentials), ``hosts`` the hosts it
    names, ``errors`` why the credentials cannot be given that way, each naming the variable and
    the host, never the password: netrc holds one login per host, so two URLs on one host with
    different credentials are refused, and a URL with ``@`` left after its host part (an unencoded
    ``@`` or ``/`` in the password) is refused before pip could print it.
    """
    sources = []
    if index_url:
        sources.append(("sglang_venv_index_url", index_url))
    sources += [(f"sglang_venv_extra_index_urls[{n}]", url) for n, url in enumerate(extra_index_urls or []) if url]
    where = f"sglang_venv_package_sets['{package_set}']"
    for step in steps:
        if step["index_url"]:
            sources.append((f"the index_url of step '{step['name']}' in {where}", step["index_url"]))
        sources += [(f"the extra_index_url of step '{step['name']}' in {where}", url)
                    for url in step["extra_index_url"]]
    return netrc_of(sources)


def netrc_of(sources: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """``index_auth`` for ``(variable, url)`` pairs (also used by scripts/lock_package_sets.py, whose uv
    reads the same netrc format through ``NETRC``)."""
    logins: dict[str, tuple[str, str, str | None]] = {}
    errors = []
    for variable, url in sources:
        public, user, password = _split_userinfo(str(url))
        if "@" in public:
            errors.append(f"{variable} has an '@' after its host part: percent-encode the user and password "
                          "(%40 for @, %2F for /, %3A for :)")
            continue
        if user is None:
            continue
        host = _URL.match(public).group(2).split(":")[0]
        if host in logins and logins[host][1:] != (user, password):
            errors.append(f"{variable} and {logins[host][0]} give different credentials for the host {host}; "
                          "pip's netrc holds one login per host: use one account for both")
            continue
        logins.setdefault(host, (variable, user, password))
    lines = [f"machine {_netrc_word(host)} login {_netrc_word(user)}"
             + (f" password {_netrc_word(password)}" if password is not None else "")
             for host, (_, user, password) in logins.items()]
    return {"netrc": "".join(line + "\n" for line in lines), "hosts": list(logins), "errors": errors}


def sets_public(package_sets: Mapping[str, Any]) -> dict[str, Any]:
    """The package sets with every step's index URLs and ``lock.torch_find_links`` without user:password@
    (the fact ``sglang_venv_settings``, which -v prints)."""
    if not isinstance(package_sets, Mapping):
        return package_sets
    out = {}
    for name, spec in package_sets.items():
        if not isinstance(spec, Mapping):
            out[name] = spec
            continue
        spec = dict(spec)
        if isinstance(spec.get("steps"), (list, tuple)):
            spec["steps"] = [
                {**step, **{key: _public_urls(step[key]) for key in ("index_url", "extra_index_url") if key in step}}
                if isinstance(step, Mapping) else step
                for step in spec["steps"]
            ]
        if isinstance(spec.get("lock"), Mapping) and "torch_find_links" in spec["lock"]:
            spec["lock"] = {**spec["lock"], "torch_find_links": url_public(spec["lock"]["torch_find_links"])}
        out[name] = spec
    return out


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
            "sglang_venv_url_public": url_public,
            "sglang_venv_normalize_steps": normalize_steps,
            "sglang_venv_steps_public": steps_public,
            "sglang_venv_index_auth": index_auth,
            "sglang_venv_sets_public": sets_public,
        }
