"""Filters of playbooks/ab_benchmark.yml: read what a host's live SGLang release runs.

Plain functions (testable without Ansible) exposed as Jinja filters:

- ``ab_benchmark_exec_python(unit_text)``: the interpreter of a systemd unit's ExecStart (its first
  word, unquoted as systemd does), e.g. ``/opt/sglang/releases/<name>/bin/python`` from the unit that
  roles/sglang_service keeps in each release directory.
- ``ab_benchmark_flag_value(argv, flag)``: the value that follows ``flag`` in an argv list (the
  release's argv.json), ``""`` when the flag is absent or has no value.
- ``ab_benchmark_instance(instances, name)``: the instance under test: the one named ``name``, the
  first without a name (``none``).
- ``ab_benchmark_probe_url(bind, port)``: the URL the probe reaches the instance at: a wildcard bind
  is probed on loopback, an IPv6 address in brackets.
- ``ab_benchmark_link_source(stat)``: where a release pointer links to, ``""`` when it is no link.
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

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", ";": ";", " ": " "}


def _first_word(line: str) -> str:
    """The first word of an ExecStart value, as systemd splits it (quotes, escapes, %% and $$)."""
    text = line.lstrip(" \t")
    while text[:1] in ("-", "@", ":", "+", "!"):  # systemd's ExecStart prefixes
        text = text[1:]
    word: list[str] = []
    quote = text[0] if text[:1] in ("'", '"') else None
    i = 1 if quote else 0
    while i < len(text):
        char = text[i]
        if quote and char == quote:
            break
        if not quote and char in " \t":
            break
        if char == "\\" and i + 1 < len(text):
            word.append(_ESCAPES.get(text[i + 1], text[i + 1]))
            i += 2
            continue
        if char in "%$" and text[i + 1 : i + 2] == char:
            i += 1
        word.append(char)
        i += 1
    return "".join(word)


def exec_python(unit_text: str) -> str:
    """The interpreter (first word) of the unit's ExecStart line."""
    for line in str(unit_text).splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "ExecStart" and value.strip():
            word = _first_word(value)
            if word:
                return word
    raise AnsibleFilterError("the unit has no ExecStart line with a command")


def flag_value(argv: Sequence[Any], flag: str) -> str:
    """The word after `flag` in argv (`--flag value`), or `--flag=value`; "" when absent."""
    words = [str(word) for word in argv]
    for index, word in enumerate(words):
        if word == flag:
            following = words[index + 1] if index + 1 < len(words) else ""
            return "" if following.startswith("--") else following
        if word.startswith(flag + "="):
            return word[len(flag) + 1 :]
    return ""


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


def link_source(stat: Mapping[str, Any]) -> Any:
    """A stat result's lnk_source when the path is a link, else ``""``."""
    return stat["lnk_source"] if stat.get("islnk", False) else ""


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
            "ab_benchmark_exec_python": exec_python,
            "ab_benchmark_flag_value": flag_value,
            "ab_benchmark_instance": instance,
            "ab_benchmark_probe_url": probe_url,
            "ab_benchmark_link_source": link_source,
            "ab_benchmark_case": case,
            "ab_benchmark_failure": failure,
        }
