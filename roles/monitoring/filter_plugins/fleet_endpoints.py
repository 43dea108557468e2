"""Filters of the monitoring and router roles: the fleet's SGLang endpoints read off the inventory,
and what Prometheus gets from them (scrape config, per-instance validated TTFT, the dashboard).

roles/router/filter_plugins/fleet_endpoints.py is a symlink to this file: the router's workers
and Prometheus's targets are the same list.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

DEFAULT_INSTANCES = [{"name": "main", "port": 30004}]


class FleetError(ValueError):
    pass


def fleet_endpoints(hostvars: Mapping[str, Any], hosts: list[str],
                    default_instances: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One entry per SGLang instance of the given hosts (inventory order):
    {host, instance, address, port, target ("address:port"), url ("http://address:port")}.

    The address is the host's `rollout_router_worker_host` if the inventory sets it, else its
    `ansible_host`, else its inventory name: the address the rollout uses for the router too.
    Instances are the host's `sglang_service_instances` (else `default_instances`)."""
    endpoints: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for host in hosts:
        hv = hostvars[host]
        address = hv.get("rollout_router_worker_host") or hv.get("ansible_host") or host
        instances = hv.get("sglang_service_instances") or default_instances or DEFAULT_INSTANCES
        for item in instances:
            if not isinstance(item, Mapping) or "name" not in item or "port" not in item:
                raise FleetError(f"{host}: each of sglang_service_instances needs a name and a port, got {item!r}")
            target = f"{address}:{int(item['port'])}"
            if target in seen:
                raise FleetError(f"{host} instance {item['name']} and {seen[target]} share {target}: "
                                 "give each instance its own port (sglang_service_instances[].port)")
            seen[target] = f"{host} instance {item['name']}"
            endpoints.append({"host": host, "instance": str(item["name"]), "address": str(address),
                              "port": int(item["port"]), "target": target, "url": f"http://{target}"})
    return endpoints


def _target(url_or_target: str) -> str:
    return url_or_target.split("://", 1)[-1].rstrip("/")


def prometheus_config(endpoints: list[dict[str, Any]], router_target: str, rule_files: list[str],
                      scrape_interval: str = "15s", evaluation_interval: str = "15s",
                      external_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """prometheus.yml as data: job `sglang` (every instance, labelled with its inventory host and
    instance name) and job `sglang-router` (the router's metrics endpoint) when one is given."""
    scrape = [{
        "job_name": "sglang",
        "metrics_path": "/metrics",
        "static_configs": [{"targets": [e["target"]],
                            "labels": {"fleet_host": e["host"], "sglang_instance": e["instance"]}}
                           for e in endpoints],
    }]
    if router_target:
        scrape.append({"job_name": "sglang-router", "metrics_path": "/metrics",
                       "static_configs": [{"targets": [_target(router_target)]}]})
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "rule_files": list(rule_files),
        "scrape_configs": scrape,
    }
    if external_labels:
        config["global"]["external_labels"] = dict(external_labels)
    return config


def validated_record(content: str | None) -> dict[str, Any]:
    """A host's /var/lib/hicache-fleet/validated.json from its slurped (base64) content; {} when absent."""
    if not content:
        return {}
    record = json.loads(base64.b64decode(content))
    return record if isinstance(record, dict) else {}


def validated_ttft(endpoints: list[dict[str, Any]], records: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Recording rules with each instance's validated TTFT figures, in seconds, labelled like its
    scrape target (instance="address:port"): `hicache_fleet:validated_cold_ttft_seconds` and
    `hicache_fleet:validated_warm_ttft_seconds` (the host-tier warm read, else the device one).
    Instances without a usable record (never validated, or a failed gate) get none."""
    rules: list[dict[str, Any]] = []
    for e in endpoints:
        entry = ((records.get(e["host"]) or {}).get("instances") or {}).get(e["instance"]) or {}
        probe = entry.get("probe") or {}
        if (probe.get("gate") or {}).get("passed") is False:
            continue
        cold = (probe.get("cold") or {}).get("median_ttft_ms")
        warm_cases = probe.get("warm") or {}
        warm = (warm_cases.get("host") or warm_cases.get("device") or {}).get("median_ttft_ms")
        labels = {"instance": e["target"], "fleet_host": e["host"], "sglang_instance": e["instance"],
                  "config_hash": str(entry.get("config_hash") or "")[:12],
                  "input_len": str(probe.get("input_len") or "")}
        for kind, value in (("cold", cold), ("warm", warm)):
            if isinstance(value, (int, float)) and value > 0:
                rules.append({"record": f"hicache_fleet:validated_{kind}_ttft_seconds",
                              "expr": f"vector({round(value / 1000.0, 6)})", "labels": labels})
    return rules


def _panel(pid: int, title: str, exprs: list[tuple[str, str]], unit: str, x: int, y: int,
           log: bool = False) -> dict[str, Any]:
    return {
        "id": pid, "type": "timeseries", "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit, **({"custom": {"scaleDistribution": {"type": "log", "log": 10}}}
                                                         if log else {})}, "overrides": []},
        "targets": [{"refId": chr(65 + i), "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(exprs)],
    }


def grafana_dashboard(endpoints: list[dict[str, Any]], title: str = "hicache-fleet",
                      uid: str = "hicache-fleet") -> dict[str, Any]:
    """A Grafana dashboard (JSON model): TTFT against the validated figures, cache hits by tier,
    host-pool use, queue, restarts, router workers. Its `fleet_host` variable lists the inventory's hosts."""
    sel = '{fleet_host=~"$fleet_host"}'
    rate = "[$__rate_interval]"
    ttft = f"sum by (fleet_host, le) (rate(sglang:time_to_first_token_seconds_bucket{sel}{rate}))"
    panels = [
        _panel(1, "TTFT p50 / p90 (log axis) and the validated cold / warm TTFT", [
            (f"histogram_quantile(0.5, {ttft})", "p50 {{fleet_host}}"),
            (f"histogram_quantile(0.9, {ttft})", "p90 {{fleet_host}}"),
            (f"hicache_fleet:validated_cold_ttft_seconds{sel}", "validated cold {{fleet_host}}"),
            (f"hicache_fleet:validated_warm_ttft_seconds{sel}", "validated warm {{fleet_host}}"),
        ], "s", 0, 0, log=True),
        _panel(2, "Cached prompt tokens by tier (tokens/s)", [
            (f"sum by (fleet_host, cache_source) (rate(sglang:cached_tokens_total{sel}{rate}))",
             "{{fleet_host}} {{cache_source}}"),
            (f"sum by (fleet_host) (rate(sglang:prompt_tokens_total{sel}{rate}))", "{{fleet_host}} prompt"),
        ], "short", 12, 0),
        _panel(3, "HiCache host pool use", [
            (f"sglang:hicache_host_used_tokens{sel} / sglang:hicache_host_total_tokens{sel}",
             "{{fleet_host}} {{sglang_instance}}"),
            (f"sglang:token_usage{sel}", "{{fleet_host}} GPU pool"),
        ], "percentunit", 0, 8),
        _panel(4, "Queue and running requests", [
            (f"sglang:num_queue_reqs{sel}", "{{fleet_host}} queued"),
            (f"sglang:num_running_reqs{sel}", "{{fleet_host}} running"),
        ], "short", 12, 8),
        _panel(5, "Restarts (scrape up/down changes, counter resets) over 1h", [
            ('changes(up{job="sglang",fleet_host=~"$fleet_host"}[1h])', "{{fleet_host}} up changes"),
            (f"resets(sglang:num_requests_total{sel}[1h])", "{{fleet_host}} counter resets"),
        ], "short", 0, 16),
        _panel(6, "Router: healthy workers and pool size", [
            ("sum(smg_worker_health)", "healthy"),
            ("sum(smg_worker_pool_size)", "pool size"),
        ], "short", 12, 16),
    ]
    hosts = sorted({e["host"] for e in endpoints})
    return {
        "uid": uid, "title": title, "schemaVersion": 39, "version": 1, "editable": True,
        "tags": ["hicache-fleet", "sglang"], "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "fleet_host", "type": "custom", "label": "host", "multi": True, "includeAll": True,
             "allValue": ".*", "query": ",".join(hosts),
             "current": {"text": "All", "value": "$__all"},
             "options": [{"text": h, "value": h, "selected": False} for h in hosts]},
        ]},
        "panels": panels,
    }


class FilterModule:
    def filters(self):
        return {
            "fleet_endpoints": fleet_endpoints,
            "prometheus_config": prometheus_config,
            "validated_record": validated_record,
            "validated_ttft": validated_ttft,
            "grafana_dashboard": grafana_dashboard,
        }
