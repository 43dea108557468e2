# hicache-fleet: the bake after a batch rejoins (issue 28 item 1), its inputs and its outcome as
# data for roles/rollout tasks/bake.yml: the settings checked before any host changes, the batch's
# instances as roles/monitoring scrapes them, the hosts not in the batch, the final decision after an
# optional warm-up, each host's bake record for the report. Plain functions, unit-tested in
# tests/rollout/test_bake_filters.py; library/fleet_bake.py does the querying and the judging.

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

NO_TRAFFIC = ("pass", "hold", "warm")
THRESHOLDS = {
    "max_ttft_p95_ratio_others": float,
    "max_ttft_p95_ratio_validated": float,
    "max_error_rate": float,
    "max_restarts": int,
    "min_tier_share_ratio": float,
    "min_others_tier_share": float,
}
MAX_BAKE_S = 3600
# roles/monitoring's fleet_endpoints default: one instance `main` on 30004 (sglang_service's default).
DEFAULT_INSTANCES = [{"name": "main", "port": 30004}]
_URL = re.compile(r"^https?://[^/\s?#]+(/\S*)?$")
_CREDENTIALS = re.compile(r"^([^/@\s]*://)[^/@\s]*@")


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number


def rollout_bake_errors(bake_s: Any, prometheus_url: Any = "", no_traffic: Any = "hold", min_requests: Any = 20,
                        thresholds: Any = None, warm_set: Any = None) -> list[str]:
    """What is wrong with the bake's settings, one sentence each naming the variable and the fix;
    empty when the bake is off (rollout_bake_s 0) or every value makes sense. The Prometheus URL is
    shown without user:password@."""
    seconds = _int(bake_s)
    if seconds is None or not 0 <= seconds <= MAX_BAKE_S:
        return [f"rollout_bake_s={bake_s!r} is not 0 (off) to {MAX_BAKE_S} seconds: set the bake window in "
                "whole seconds"]
    if seconds == 0:
        return []
    errors = []
    url = "" if prometheus_url is None else str(prometheus_url)
    if not _URL.match(url):
        shown = _CREDENTIALS.sub(r"\1(credentials)@", url)
        errors.append(f"rollout_prometheus_url={shown!r} is not the fleet's Prometheus base URL "
                      "(http(s)://HOST:PORT): rollout_bake_s > 0 needs it")
    if no_traffic not in NO_TRAFFIC:
        errors.append(f"rollout_bake_no_traffic={no_traffic!r} is not one of pass, hold, warm")
    elif no_traffic == "warm" and not warm_set:
        errors.append("rollout_bake_no_traffic=warm sends the warm set as traffic, but rollout_warm_set is empty: "
                      "list the warm set's files, or choose hold or pass")
    requests = _int(min_requests)
    if requests is None or requests < 1:
        errors.append(f"rollout_bake_min_requests={min_requests!r} is not a whole number of at least 1")
    if thresholds is None:
        thresholds = {}
    if not isinstance(thresholds, Mapping):
        errors.append(f"rollout_bake_thresholds must be a mapping of threshold names to numbers, not {thresholds!r}")
        return errors
    for key, value in thresholds.items():
        kind = THRESHOLDS.get(key)
        if kind is None:
            errors.append(f"rollout_bake_thresholds.{key} is not a threshold of the bake (one of "
                          f"{', '.join(THRESHOLDS)})")
            continue
        try:
            number = kind(value)
        except (TypeError, ValueError):
            number = None
        if number is None or isinstance(value, bool) or number < 0:
            errors.append(f"rollout_bake_thresholds.{key}={value!r} is not a number of at least 0")
    return errors


def _address(hv: Mapping[str, Any], host: str) -> str:
    return str(hv.get("rollout_router_worker_host") or hv.get("ansible_host") or host)


def rollout_bake_targets(hostvars: Mapping[str, Any], host: str) -> list[str]:
    """The `instance` label values of a host's SGLang instances as roles/monitoring scrapes them
    (its fleet_endpoints filter's `target`, address:port): the address is the host's
    rollout_router_worker_host, else ansible_host, else its name; the instances its
    sglang_service_instances (default main on 30004)."""
    hv = hostvars[host]
    instances = hv.get("sglang_service_instances") or DEFAULT_INSTANCES
    return [f"{_address(hv, host)}:{int(item['port'])}" for item in instances]


def _validated(record: Any) -> dict[str, Any]:
    """A host's validated figures (its validated record as the gate wrote it this run): the largest
    cold and warm median TTFT over its instances (the live p95 is held to the cold one)."""
    instances = (record or {}).get("instances") if isinstance(record, Mapping) else None
    colds, warms = [], []
    for entry in (instances or {}).values():
        probe = (entry or {}).get("probe") or {}
        cold = (probe.get("cold") or {}).get("median_ttft_ms")
        if isinstance(cold, (int, float)):
            colds.append(float(cold))
        for case in (probe.get("warm") or {}).values():
            warm = (case or {}).get("median_ttft_ms")
            if isinstance(warm, (int, float)):
                warms.append(float(warm))
    figures: dict[str, Any] = {}
    if colds:
        figures["cold_ttft_ms"] = max(colds)
    if warms:
        figures["warm_ttft_ms"] = max(warms)
    return figures


def rollout_bake_instances(hostvars: Mapping[str, Any], batch: list[str]) -> list[dict[str, Any]]:
    """library/fleet_bake's `instances`: each host of the batch with its targets and its validated
    figures (the record its gate wrote this run, _rollout_gate_fleet_record)."""
    return [{"host": host, "targets": rollout_bake_targets(hostvars, host),
             "validated": _validated(hostvars[host].get("_rollout_gate_fleet_record"))} for host in batch]


def rollout_bake_others(hostvars: Mapping[str, Any], fleet: list[str], batch: list[str]) -> list[str]:
    """library/fleet_bake's `others`: the targets of the fleet's hosts not in the batch."""
    return [target for host in fleet if host not in set(batch) for target in rollout_bake_targets(hostvars, host)]


def rollout_bake_final(first: Mapping[str, Any], again: Any = None) -> dict[str, Any]:
    """The bake's result the run acts on. With rollout_bake_no_traffic=warm the batch is baked once
    more after the warm set was sent (`again`); that second bake decides, and when it is still
    inconclusive the run holds (it never warms twice)."""
    result = dict(first)
    if isinstance(again, Mapping) and again.get("verdict") and not again.get("skipped"):
        result = dict(again)
        result["warmed"] = True
        result["first"] = {"verdict": first.get("verdict"), "msg": first.get("msg")}
        if result.get("action") == "warm":
            result["action"] = "hold"
    return result


def _outcome(verdict: str, action: str, no_traffic: str, warmed: bool) -> str:
    if verdict == "not_run":
        return "not run (check mode: no query sent)"
    if verdict == "failed":
        return "failed: rolled back, the run stops"
    if verdict == "passed":
        return "passed" + (" (after the warm set was sent as traffic)" if warmed else "")
    said = f"rollout_bake_no_traffic={no_traffic}"
    if action == "continue":
        return f"inconclusive: passed by {said}"
    if action == "hold":
        return (f"inconclusive after the warm set was sent as traffic: held ({said})" if warmed
                else f"inconclusive: held ({said}), the run stops after this batch")
    return f"inconclusive ({said}: {action})"


def rollout_bake_host(result: Mapping[str, Any], host: str) -> dict[str, Any]:
    """One host's bake as its record in the run report shows it beside its probe: its verdict, its
    figures (TTFT p50/p95, tier shares, errors, restarts), its validated figures, the reasons, the
    other hosts' figures, the window and what the run did (outcome)."""
    entry = ((result.get("hosts") or {}).get(host) or {}) if isinstance(result, Mapping) else {}
    verdict = str(result.get("verdict") or "not_run")
    host_verdict = str(entry.get("verdict") or verdict)
    action = str(result.get("action") or "continue")
    no_traffic = str(result.get("no_traffic") or "hold")
    warmed = bool(result.get("warmed"))
    figures = entry.get("figures") or {}
    others = result.get("others") or {}
    keep = ("requests", "ttft_p50_ms", "ttft_p95_ms", "tier_share", "error_rate", "aborted_requests", "restarts",
            "down_targets", "ttft_p95_vs_validated_cold", "ttft_p95_vs_others")
    return {
        "verdict": host_verdict,
        "batch_verdict": verdict,
        "action": action,
        "no_traffic": no_traffic,
        "warmed": warmed,
        "window_s": result.get("window_s"),
        "outcome": _outcome(host_verdict if host_verdict in ("failed", "passed") else verdict, action, no_traffic,
                            warmed),
        "figures": {k: figures[k] for k in keep if k in figures},
        "validated": dict(entry.get("validated") or {}),
        "others": {k: others[k] for k in ("requests", "ttft_p50_ms", "ttft_p95_ms", "tier_share") if k in others},
        "reasons": [str(r) for r in entry.get("reasons") or []],
        "error": result.get("error"),
        "msg": str(result.get("msg") or ""),
    }


def rollout_bake_failure(bake: Mapping[str, Any]) -> str:
    """The message a host that failed its bake fails with (the rollback's reason in the report)."""
    reasons = "; ".join(bake.get("reasons") or []) or "no reason given"
    return f"bake failed over {bake.get('window_s')} s: {reasons}"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "rollout_bake_errors": rollout_bake_errors,
            "rollout_bake_targets": rollout_bake_targets,
            "rollout_bake_instances": rollout_bake_instances,
            "rollout_bake_others": rollout_bake_others,
            "rollout_bake_final": rollout_bake_final,
            "rollout_bake_host": rollout_bake_host,
            "rollout_bake_failure": rollout_bake_failure,
        }
