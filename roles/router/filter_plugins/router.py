"""Filters of the router role: the router's command line as data, and what to change in its live
worker list (plain functions, tested in tests/test_router_filters.py).

- ``router_argv(flags)``: ``{flag: value}`` to the router's argv.
- ``router_worker_changes(listed, wanted)``: the workers to add to and remove from the live router.
- ``router_auth_headers(key)``: the control plane's Authorization header (none without a key).
- ``router_install_source(wheelhouse_dir)``: where the venv's packages come from (offline or index).
- ``router_pip_argv(venv, root, wheelhouse_dir)``: pip's argv that installs the pinned set.
- ``router_control_plane_keys(key)``: the --control-plane-api-keys value (none without a key).
- ``router_worker_url(base, id)``: ``<base>/workers/<id>``, the router-supplied id percent-encoded.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any


class RouterError(ValueError):
    pass


def router_argv(flags: Mapping[str, Any]) -> list[str]:
    """{flag: value} → argv words: true = switch, false/null = left out, a list = several values."""
    words: list[str] = []
    for flag, value in flags.items():
        if not str(flag).startswith("--"):
            raise RouterError(f"router flag {flag!r}: write it as '--name' (router_extra_args)")
        if value is None or value is False:
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, Sequence) and not isinstance(value, str):
            words += [flag, *(str(v) for v in value)]
        else:
            words += [flag, str(value)]
    return words


def router_worker_changes(listed: Sequence[Mapping[str, Any]], wanted: Sequence[str]) -> dict[str, list]:
    """Compare GET /workers with the inventory's worker URLs: {add: [url], remove: [{id, url}]}.
    URLs compare without a trailing slash; a URL listed twice is removed once."""
    def norm(url: str) -> str:
        return str(url).rstrip("/")

    want = [norm(u) for u in wanted]
    have: dict[str, Mapping[str, Any]] = {}
    remove: list[dict[str, str]] = []
    for worker in listed:
        url = norm(worker.get("url", ""))
        if url in have or url not in want:
            remove.append({"id": str(worker.get("id")), "url": url})
        else:
            have[url] = worker
    return {"add": [u for u in want if u not in have], "remove": remove}


def router_auth_headers(key: Any) -> dict[str, str]:
    """``{'Authorization': 'Bearer <key>'}`` for a control-plane api key, ``{}`` without one."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def router_install_source(wheelhouse_dir: str) -> str:
    """``offline`` when the venv installs from a wheelhouse (router_wheelhouse_dir set), else ``index``."""
    return "offline" if len(wheelhouse_dir) > 0 else "index"


def router_pip_argv(venv: str, root: str, wheelhouse_dir: str) -> list[str]:
    """pip install of root/requirements.txt into the venv, from root/wheelhouse only when offline."""
    offline = ["--no-index", "--find-links", f"{root}/wheelhouse"] if len(wheelhouse_dir) > 0 else []
    return [f"{venv}/bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            *offline, "-r", f"{root}/requirements.txt"]


def router_control_plane_keys(key: Any) -> list[str] | None:
    """The router's one control-plane key (``hicache-fleet:hicache-fleet:admin:<key>``), none without a key."""
    return [f"hicache-fleet:hicache-fleet:admin:{key}"] if key else None


def router_worker_url(base: str, worker_id: Any) -> str:
    """The router's URL of one worker, the id (which the router supplied) percent-encoded whole."""
    return f"{str(base).rstrip('/')}/workers/{urllib.parse.quote(str(worker_id), safe='')}"


class FilterModule:
    def filters(self):
        return {
            "router_argv": router_argv,
            "router_worker_changes": router_worker_changes,
            "router_auth_headers": router_auth_headers,
            "router_install_source": router_install_source,
            "router_pip_argv": router_pip_argv,
            "router_control_plane_keys": router_control_plane_keys,
            "router_worker_url": router_worker_url,
        }
