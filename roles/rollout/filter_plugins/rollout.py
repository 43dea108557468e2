"""Filters of the rollout role: turn a probe loop result into the record a host keeps, and find
the baseline an instance's probe is held to."""

from __future__ import annotations

import base64
import json
import os
import re
import statistics
from collections.abc import Mapping, Sequence
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
    "median_storage_cached_tokens",
    "cached_fraction",
    "host_cached_fraction",
    "storage_cached_fraction",
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
        # The L3 tier's cache identity the instance was validated with ('' without the tier): the next
        # gate expects a prefix served before its restart back from storage only when it is the same.
        "l3_id": (instance.get("l3") or {}).get("id", ""),
        "probe": {
            "input_len": (result.get("plan") or {}).get("input_len")
            or ((result.get("invocation") or {}).get("module_args") or {}).get("input_len"),
            "server": {key: server[key] for key in _SERVER_KEYS if key in server},
            "cold": _case(result.get("cold")),
            "warm": {tier: _case(case) for tier, case in warm.items()},
            "gate": result.get("gate") or {},
            "pools": _pools(result.get("pools")),
            # With the L3 tier: the prefix served before the restart, re-read first (tokens by tier, TTFT).
            "restart_hit": result.get("restart_hit") or {},
        },
    }


_POOL_KEYS = ("device_tokens", "kvcache_gb", "host_tokens", "host_expected", "hicache_cost", "note")


def _pools(pools: Any) -> dict[str, Any]:
    """The pools the probe checked after start (module_utils/sglang_pool_plan.py, issue 25 item 2)."""
    return {key: pools[key] for key in _POOL_KEYS if key in pools} if isinstance(pools, dict) else {}


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


def _validated_probe(record: Any, instance: str) -> dict[str, Any] | None:
    """The probe summary a host's validation record keeps for an instance, if it is usable."""
    if not isinstance(record, Mapping):
        return None
    entry = (record.get("instances") or {}).get(instance)
    probe = entry.get("probe") if isinstance(entry, Mapping) else None
    if not isinstance(probe, Mapping):
        return None
    cold_ms = (probe.get("cold") or {}).get("median_ttft_ms")
    input_len = probe.get("input_len")
    if not isinstance(cold_ms, (int, float)) or cold_ms <= 0 or not isinstance(input_len, int):
        return None
    if (probe.get("gate") or {}).get("passed") is False:
        return None
    return dict(probe)


def rollout_fleet_median(records: Mapping[str, Any], instance: str, input_len: int) -> dict[str, Any]:
    """The median validated figures of an instance over other hosts' records ({host: record}).

    Like with like: only records probed with the same input_len, if any; else those of the shortest
    longer input_len (the probe module scales their cold TTFT down and leaves their warm figures out).
    Shorter prompts are never used. {} when no host has a usable record."""
    probes = {host: p for host, rec in records.items() if (p := _validated_probe(rec, instance))}
    lengths = sorted({p["input_len"] for p in probes.values() if p["input_len"] >= input_len})
    if not lengths:
        return {}
    length = lengths[0]
    chosen = {host: p for host, p in sorted(probes.items()) if p["input_len"] == length}
    tiers = sorted({tier for p in chosen.values() for tier in (p.get("warm") or {})})
    warm = {}
    for tier in tiers:
        values = [((p.get("warm") or {}).get(tier) or {}).get("median_ttft_ms") for p in chosen.values()]
        values = [v for v in values if isinstance(v, (int, float))]
        if values:
            warm[tier] = {"median_ttft_ms": statistics.median(values)}
    hosts = list(chosen)
    return {
        "source": f"the fleet median of {len(hosts)} validated host{'s' if len(hosts) > 1 else ''} "
                  f"({', '.join(hosts)})",
        "input_len": length,
        "hosts": hosts,
        "cold": {"median_ttft_ms": statistics.median(p["cold"]["median_ttft_ms"] for p in chosen.values())},
        "warm": warm,
    }


def rollout_gate_baseline(
    record: Any, hostvars: Mapping[str, Any], hosts: list[str], me: str, instance: str, input_len: Any
) -> dict[str, Any]:
    """What an instance's probe is held to: this host's last validated result for it, else the fleet
    median of the other hosts' records (the `_rollout_gate_fleet_record` each host of this run set
    when it read its record, updated after it passed). {} when there is none (a first canary)."""
    own = _validated_probe(record, instance)
    if own:
        return {**own, "source": "the last validated result on this host"}
    records = {}
    for host in hosts:
        if host == me:
            continue
        try:
            records[host] = hostvars[host]["_rollout_gate_fleet_record"]
        except KeyError:  # a host of a later batch: not read yet in this run
            continue
    return rollout_fleet_median(records, instance, int(input_len))


def rollout_gate_verdict(targets: Sequence[Any], check_mode: Any) -> str:
    """A gated host's verdict in its report (roles/rollout_gate tasks/main.yml): unchanged with nothing
    to probe; in check mode no probe request is sent, so never passed, only pending."""
    if not targets:
        return "unchanged"
    return "would be probed (check mode)" if _truthy(check_mode) else "passed"


def rollout_gate_unvalidated_note(unvalidated: Sequence[Any], check_mode: Any) -> str:
    """The report's note on instances found running a release the host never validated
    (roles/rollout_gate tasks/plan.yml), which the gate probes without a restart; empty for none."""
    if not unvalidated:
        return ""
    outcome = "it would be probed (check mode)" if _truthy(check_mode) else "probed now without a restart: passed"
    names = ", ".join(str(name) for name in unvalidated)
    return f"{names} found running a release this host never validated; {outcome}"


def rollout_gate_tier(instance: Mapping[str, Any], setting: str = "auto") -> str:
    """The probe tier of an instance: a fixed setting (device, host, both, all) applies as given; auto
    is all (device, host and the L3 storage tier) when the instance runs the L3 tier, both (device and
    HiCache's host tier) when it runs HiCache, device when it does not."""
    if setting != "auto":
        return setting
    if (instance.get("l3") or {}).get("id"):
        return "all"
    return "both" if _truthy(instance.get("hicache")) else "device"


def rollout_gate_restart_storage(instance: Mapping[str, Any], record: Any, minimum: float) -> float | None:
    """Issue 27 item 2: the storage share the gate requires of the prefix this host served before its
    restart (the previous gate's seeded prompt), re-read first after the restart: `minimum` when the
    instance runs the L3 tier with the same cache identity it was last validated with, else None (not
    checked: a new identity starts an empty directory that must never read the old one)."""
    identity = (instance.get("l3") or {}).get("id")
    instances = (record or {}).get("instances") if isinstance(record, Mapping) else None
    before = (instances or {}).get(instance.get("name")) if isinstance(instances, Mapping) else None
    if not identity or not isinstance(before, Mapping) or before.get("l3_id") != identity:
        return None
    return float(minimum)


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return bool(value)


def rollout_inventory_label(sources: list[str], cwd: str | None) -> str:
    """The run's inventory sources as the operator named them: relative to the directory the run
    started in (cwd) when they are under it, else absolute."""
    labels = []
    for source in sources or []:
        path = os.path.abspath(str(source))
        under = bool(cwd) and os.path.commonpath([path, os.path.abspath(cwd)]) == os.path.abspath(cwd)
        labels.append(os.path.relpath(path, cwd) if under else path)
    return ", ".join(labels)


_NOTIFY_URL = re.compile(r"^https?://[^/@\s?#]+(/\S*)?$")


def rollout_notify_errors(url: Any, timeout: Any = 10) -> list[str]:
    """What is wrong with the notification settings (issue 28): rollout_notify_url empty (off) or an
    http(s) URL without user:password@; rollout_notify_timeout_s 1 to 120 seconds. The URL is never
    repeated (a webhook URL is a secret)."""
    errors = []
    text = "" if url is None else str(url)
    if text and not _NOTIFY_URL.match(text):
        errors.append(
            "rollout_notify_url is not an http(s)://HOST[:PORT]/PATH URL without user:password@ (its value is not "
            "shown: it is a secret): set the webhook's URL, put credentials into rollout_notify_headers (e.g. "
            "Authorization), or set it to \"\" for no notification"
        )
    try:
        seconds = int(timeout)
    except (TypeError, ValueError):
        seconds = 0
    if not 1 <= seconds <= 120 or isinstance(timeout, bool):
        errors.append(f"rollout_notify_timeout_s={timeout!r} is not 1 to 120 seconds: set a whole number of seconds")
    return errors


def rollout_warm_summary(result: Any) -> dict[str, Any]:
    """One instance's warm-up (library/sglang_warm_set's result) as the report shows it: tokens sent,
    cached on that send, seconds, the files that failed and the module's summary line."""
    result = result if isinstance(result, dict) else {}
    return {
        "warm_tokens": result.get("warm_tokens", 0),
        "cached_tokens": result.get("cached_tokens", 0),
        "seconds": result.get("seconds"),
        "sent": result.get("sent", 0),
        "ok": result.get("ok", 0),
        "failed_files": result.get("failed_files") or [],
        "summary": result.get("msg") or ("warm-up did not run: " + str(result.get("module_stderr") or "no detail")[:300]
                                          if result.get("failed") else ""),
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "rollout_notify_errors": rollout_notify_errors,
            "rollout_gate_summary": rollout_gate_summary,
            "rollout_gate_reasons": rollout_gate_reasons,
            "rollout_gate_baseline": rollout_gate_baseline,
            "rollout_gate_tier": rollout_gate_tier,
            "rollout_gate_verdict": rollout_gate_verdict,
            "rollout_gate_unvalidated_note": rollout_gate_unvalidated_note,
            "rollout_gate_restart_storage": rollout_gate_restart_storage,
            "rollout_record": rollout_record,
            "rollout_order": rollout_order,
            "rollout_plan_summary": rollout_plan_summary,
            "rollout_inventory_label": rollout_inventory_label,
            "rollout_warm_summary": rollout_warm_summary,
        }
