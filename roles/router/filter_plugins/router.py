"""Filters of the router role: the router's command line as data, and what to change in its live
worker list (plain functions, tested in tests/test_router_filters.py)."""

from __future__ import annotations

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


class FilterModule:
    def filters(self):
        return {"router_argv": router_argv, "router_worker_changes": router_worker_changes}
