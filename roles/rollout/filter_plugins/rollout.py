"""Filters of the rollout role: turn a probe loop result into the record a host keeps."""

from __future__ import annotations

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


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"rollout_gate_summary": rollout_gate_summary, "rollout_gate_reasons": rollout_gate_reasons}
