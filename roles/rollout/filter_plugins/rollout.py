"""Filters of the rollout role: turn a probe loop result into the record a host keeps."""

from __future__ import annotations

import base64
import json
from typing import Any

# Per-run lists stay in the probe's own report; the record keeps what the gate and people read.
_CASE_KEYS = (
    "completed",
    "median_ttft_ms",
    "median_e2e_latency_ms",
    "input_throughput",
    "median_cached_tokens",
    "median_device_cached_tokens",
    "median_host_cached_tokens",
    "cached_fraction",
    "host_cached_fraction",
    "warm_cold_ratio",
    "speedup",
    "cache_report",
)
_SERVER_KEYS = ("version", "max_total_num_tokens", "page_size", "enable_hierarchical_cache", "hicache_args")


def _case(case: dict[str, Any] | None) -> dict[str, Any]:
    return {key: case[key] for key in _CASE_KEYS if case and key in case}


def rollout_gate_summary(result: dict[str, Any]) -> dict[str, Any]:
    """One instance's probe result (an item of a registered loop) as its validation record."""
    instance = result.get("item") or {}
    warm = result.get("warm") or {}
    server = result.get("server") or {}
    return {
        "instance": instance.get("name"),
        "unit": instance.get("unit"),
        "config_hash": instance.get("config_hash"),
        "components": instance.get("components") or {},
        "probe": {
            "input_len": (result.get("plan") or {}).get("input_len")
            or ((result.get("invocation") or {}).get("module_args") or {}).get("input_len"),
            "server": {key: server[key] for key in _SERVER_KEYS if key in server},
            "cold": _case(result.get("cold")),
            "warm": {tier: _case(case) for tier, case in warm.items()},
            "gate": result.get("gate") or {},
        },
    }


def rollout_gate_reasons(result: dict[str, Any]) -> list[str]:
    """Every violated threshold (or failure message) of a failed task result, loop or not."""
    items = result.get("results") if isinstance(result.get("results"), list) else [result]
    reasons: list[str] = []
    for item in items:
        if not item.get("failed"):
            continue
        gate_reasons = (item.get("gate") or {}).get("reasons") or []
        if gate_reasons:
            label = (item.get("item") or {}).get("unit")
            reasons += [f"{label}: {reason}" if label else reason for reason in gate_reasons]
        elif item.get("msg"):
            reasons.append(str(item["msg"]))
    if not reasons and result.get("msg"):
        reasons.append(str(result["msg"]))
    return reasons


def rollout_record(content: str | None) -> dict[str, Any]:
    """A host's validation record from its slurped (base64) content; an empty record when absent."""
    if not content:
        return {"instances": {}}
    record = json.loads(base64.b64decode(content))
    if not isinstance(record, dict) or not isinstance(record.get("instances"), dict):
        raise ValueError("the validation record has no 'instances' mapping")
    return record


def rollout_order(inventory_hosts: list[str], play_hosts: list[str], canary: list[str]) -> list[str]:
    """This run's hosts in the inventory's order, the canary group's hosts first.

    `inventory_hosts` is groups['sglang_hosts'] (stable, inventory order), `play_hosts` the run's
    hosts after --limit (any order), `canary` groups['sglang_canary'] (may be empty).
    """
    in_run = set(play_hosts)
    ordered = [host for host in inventory_hosts if host in in_run]
    ordered += [host for host in play_hosts if host not in set(ordered)]
    first = [host for host in ordered if host in set(canary)]
    return first + [host for host in ordered if host not in set(first)]


def rollout_plan_summary(pending: list[str], targets: list[str], unvalidated: list[str]) -> str:
    """One line on what a host's release needs: the instances that restart and those probed."""
    if not pending and not targets:
        return "runs its validated release; nothing to restart or probe."
    text = f"restart {', '.join(pending) or 'nothing'}; probe {', '.join(targets) or 'nothing'}"
    if unvalidated:
        text += (f" ({', '.join(unvalidated)} already run a release that was never validated:"
                 " an earlier run stopped before its gate)")
    return text + "."


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"rollout_gate_summary": rollout_gate_summary, "rollout_gate_reasons": rollout_gate_reasons,
                "rollout_record": rollout_record, "rollout_order": rollout_order,
                "rollout_plan_summary": rollout_plan_summary}
