"""Filters of playbooks/rollback_validated.yml: which instances of a host do not serve the release it
last validated.

- ``rollback_validated_plan(current_stats, instances)``: ``current_stats`` is the registered loop
  of ``stat`` on each validated instance's ``<state>/<name>/current`` (items of the validation
  record's ``instances`` as ``dict2items``); the result lists, in that order, each instance whose
  ``current`` is missing, no link, or links to a release directory other than its validated one (a
  release directory is named by the first 12 characters of its config hash):
  ``{name, current, validated}`` (``current`` the directory's name, ``""`` when there is none).
- ``rollback_validated_lines(plan)``: one line per entry, ``main: 0123456789ab -> ba9876543210``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def rollback_validated_plan(current_stats: Sequence[Mapping[str, Any]],
                            instances: Mapping[str, Mapping[str, Any]]) -> list[dict[str, str]]:
    plan = []
    for result in current_stats:
        name = str((result.get("item") or {}).get("key"))
        validated = str((instances.get(name) or {}).get("config_hash") or "")[:12]
        stat = result.get("stat") or {}
        source = str(stat.get("lnk_source") or "") if stat.get("islnk") else ""
        current = source.rstrip("/").rsplit("/", 1)[-1] if source else ""
        if not validated or current != validated:
            plan.append({"name": name, "current": current, "validated": validated})
    return plan


def rollback_validated_lines(plan: Sequence[Mapping[str, str]]) -> list[str]:
    return [f"{entry['name']}: {entry['current'] or '(no current release)'} -> {entry['validated']}" for entry in plan]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"rollback_validated_plan": rollback_validated_plan,
                "rollback_validated_lines": rollback_validated_lines}
