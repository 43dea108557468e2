"""Filters of playbooks/ab_benchmark.yml: the instance under test, its probe URL and the table's rows.

What a host's live release runs is read by roles/sglang_service (its entry point snapshot).

Plain functions (testable without Ansible) exposed as Jinja filters:

- ``ab_benchmark_instance(instances, name)``: the instance under test: the one named ``name``, the
  first without a name (``none``).
- ``ab_benchmark_probe_url(bind, port)``: the URL the probe reaches the instance at: a wildcard bind
  is probed on loopback, an IPv6 address in brackets.
- ``ab_benchmark_case(item, baseline, hicache)``: one row of the A/B table (a launch and a tier) from
  the probe figures of the two launches.
- ``ab_benchmark_failure(result)``: what a failed task said: the first failed loop item's msg, else
  the task's msg (``no detail`` without one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain-Python use (unit tests without Ansible)
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]

def instance(instances: Sequence[Mapping[str, Any]], name: Any = None) -> Mapping[str, Any]:
    """The first instance named `name`, or the first instance when no name is asked for (`None`)."""
    chosen = [entry for entry in instances if name is None or entry.get("name") == name]
    if not chosen:
        raise AnsibleFilterError(f"no instance {name!r} among {[entry.get('name') for entry in instances]}")
    return chosen[0]


def probe_host(bind: Any) -> Any:
    """The address a probe on the host reaches a server bound to `bind` at (wildcards: loopback)."""
    if bind in ("0.0.0.0", "", "*"):  # noqa: S104 (wildcard binds, probed on loopback)
        return "127.0.0.1"
    if bind == "::":
        return "::1"
    return bind


def probe_url(bind: Any, port: Any) -> str:
    """``http://<probe host>:<port>``, an IPv6 probe host in brackets."""
    host = probe_host(bind)
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


_CASE_FIGURES = ("median_ttft_ms", "ttfts_ms", "input_throughput", "median_e2e_latency_ms", "median_cached_tokens",
                 "median_host_cached_tokens", "cached_fraction", "host_cached_fraction", "cache_report")


def case(item: Mapping[str, Any], baseline: Mapping[str, Any], hicache: Mapping[str, Any]) -> dict[str, Any]:
    """The table row of `item` ({hicache, tier, label}): the figures of its launch's probe for its tier.

    The HiCache launch's probe when item.hicache, else the baseline's; the cold figures for tier
    ``cold``, else ``warm[tier]`` (``device`` or ``host``); the server's KV capacity of that launch.
    """
    probe = hicache if item["hicache"] else baseline
    figures = probe["cold"] if item["tier"] == "cold" else probe["warm"][item["tier"]]
    row: dict[str, Any] = {
        "name": f"{'HiCache' if item['hicache'] else 'baseline'} · {item['label']}",
        "hicache": item["hicache"],
        "tier": item["tier"],
    }
    row.update((key, figures[key]) for key in _CASE_FIGURES)
    row["max_total_num_tokens"] = probe["server"]["max_total_num_tokens"]
    return row


def failure(result: Mapping[str, Any]) -> Any:
    """The msg of the first loop item that failed, else the result's own msg (``no detail`` without one)."""
    failed = [item for item in result.get("results", []) if item.get("failed")]
    if failed:
        return failed[0]["msg"]
    return result.get("msg", "no detail")


class FilterModule:
    """Jinja filters of playbooks/ab_benchmark.yml."""

    def filters(self) -> dict[str, Any]:
        return {
            "ab_benchmark_instance": instance,
            "ab_benchmark_probe_url": probe_url,
            "ab_benchmark_case": case,
            "ab_benchmark_failure": failure,
        }
