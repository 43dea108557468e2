# hicache-fleet: the bake's decision after a batch rejoins (issue 28 item 1). The fleet's Prometheus
# (roles/monitoring: job "sglang", one target per SGLang instance, label instance="address:port") is
# asked for the batch's and the other hosts' figures over the bake window; each batch host is judged
# against its own validated figures and against the other hosts.
# Plain functions, unit-tested in tests/bake; the module library/fleet_bake.py uses them.
# Runs on the controller (delegate_to: localhost): standard library only.

from __future__ import annotations

import base64
import http.client
import json
import math
import re
import urllib.parse

VERDICTS = ("passed", "failed", "inconclusive")
NO_TRAFFIC = ("pass", "hold", "warm")
TIERS = ("device", "host", "storage")
MAX_BODY = 16 * 1024 * 1024

THRESHOLD_SPEC = {
    "max_ttft_p95_ratio_others": {"type": "float", "default": 3.0},
    "max_ttft_p95_ratio_validated": {"type": "float", "default": 3.0},
    "max_error_rate": {"type": "float", "default": 0.01},
    "max_restarts": {"type": "int", "default": 0},
    "min_tier_share_ratio": {"type": "float", "default": 0.5},
    "min_others_tier_share": {"type": "float", "default": 0.05},
}

ARGUMENT_SPEC = {
    "prometheus_url": {"type": "str", "required": True},
    "bearer_token": {"type": "str", "no_log": True},
    "job": {"type": "str", "default": "sglang"},
    "instances": {
        "type": "list", "elements": "dict", "required": True,
        "options": {
            "host": {"type": "str", "required": True},
            "targets": {"type": "list", "elements": "str", "required": True},
            "validated": {"type": "dict", "default": {}},
        },
    },
    "others": {"type": "list", "elements": "str", "default": []},
    "window_s": {"type": "int", "required": True},
    "min_requests": {"type": "int", "default": 20},
    "thresholds": {"type": "dict", "default": {}, "options": THRESHOLD_SPEC, "apply_defaults": True},
    "no_traffic": {"type": "str", "default": "hold", "choices": list(NO_TRAFFIC)},
    "timeout_s": {"type": "float", "default": 10.0},
}


class BakeError(Exception):
    """Prometheus could not answer a query: the bake is inconclusive with this text."""


def default_thresholds() -> dict:
    return {name: spec["default"] for name, spec in THRESHOLD_SPEC.items()}


def validate_params(p: dict) -> list[str]:
    """Every bad option, one sentence each, naming it and the fix (nothing is queried before)."""
    errors = []
    url = p.get("prometheus_url") or ""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        errors.append(f"prometheus_url must be the Prometheus base URL, http(s)://host:port (got "
                      f"{redact_url(url)!r}).")
    if not isinstance(p.get("window_s"), int) or p["window_s"] < 1:
        errors.append(f"window_s must be a whole number of seconds of at least 1 (got {p.get('window_s')!r}): "
                      "the bake's length, no longer than the time since the batch rejoined.")
    if not isinstance(p.get("min_requests"), int) or p["min_requests"] < 1:
        errors.append(f"min_requests must be at least 1 (got {p.get('min_requests')!r}).")
    timeout = p.get("timeout_s")
    if timeout is None or not (timeout > 0 and math.isfinite(timeout)):
        errors.append(f"timeout_s must be a number of seconds greater than 0 (got {timeout!r}).")
    instances = p.get("instances") or []
    if not instances:
        errors.append("instances must list the batch's hosts, each {host, targets, validated}.")
    seen_hosts: set[str] = set()
    seen_targets: dict[str, str] = {}
    for item in instances:
        host = item.get("host")
        if host in seen_hosts:
            errors.append(f"instances: host {host} is listed twice; list each host once with all its targets.")
        seen_hosts.add(host)
        targets = item.get("targets") or []
        if not targets:
            errors.append(f"instances: host {host} has no targets; give the instance label values "
                          "(address:port) the monitoring role scrapes it as.")
        for target in targets:
            if not isinstance(target, str) or not target.strip():
                errors.append(f"instances: host {host} has an empty target.")
            elif target in seen_targets:
                errors.append(f"instances: target {target} of {host} is also {seen_targets[target]}'s.")
            seen_targets[target] = host
        for key in ("cold_ttft_ms", "warm_ttft_ms"):
            value = (item.get("validated") or {}).get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0):
                errors.append(f"instances: host {host} validated.{key} must be a number of ms above 0 or "
                              f"left out (got {value!r}).")
    for target in p.get("others") or []:
        if target in seen_targets:
            errors.append(f"others: target {target} is in the batch ({seen_targets[target]}); others are "
                          "the hosts not in the batch.")
    given = {k: v for k, v in (p.get("thresholds") or {}).items() if v is not None}
    thresholds = {**default_thresholds(), **given}
    for name, value in thresholds.items():
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
                or (isinstance(value, float) and not math.isfinite(value))):
            errors.append(f"thresholds.{name} must be a number of at least 0 (got {value!r}).")
    for name in ("max_ttft_p95_ratio_others", "max_ttft_p95_ratio_validated"):
        value = thresholds.get(name)
        if isinstance(value, (int, float)) and 0 <= value < 1:
            errors.append(f"thresholds.{name} must be at least 1 (got {value!r}): a ratio below 1 fails a "
                          "host faster than its reference.")
    return errors


def redact_url(url: str) -> str:
    """The URL without user:password@, for messages."""
    parsed = urllib.parse.urlsplit(url or "")
    if parsed.username is None and parsed.password is None:
        return url
    netloc = parsed.hostname or ""
    if parsed.port:
        netloc += f":{parsed.port}"
    return urllib.parse.urlunsplit((parsed.scheme, netloc, parsed.path, parsed.query, parsed.fragment))


def _regex(targets: list[str]) -> str:
    """A PromQL string literal body matching exactly these label values (RE2, anchored by Prometheus)."""
    alternatives = "|".join(re.escape(t) for t in targets)
    return alternatives.replace("\\", "\\\\").replace('"', '\\"')


def selector(targets: list[str], job: str | None) -> str:
    matchers = []
    if job:
        matchers.append(f'job="{job}"')
    matchers.append(f'instance=~"{_regex(targets)}"')
    return "{" + ",".join(matchers) + "}"


def build_queries(p: dict) -> dict[str, str]:
    """Every PromQL query the bake sends, by name (each an instant vector at the query time).

    Per instance (batch and others together, `by (instance)`): requests, prompt tokens, cached tokens
    by tier, aborted requests (increase over the window); TTFT p50/p95 (histogram_quantile over the
    window's rate); counter resets and scrape up/down changes (restarts); up now. The others pooled:
    TTFT p50/p95 over all their instances' buckets."""
    batch = [t for item in p["instances"] for t in item["targets"]]
    others = list(p.get("others") or [])
    sel = selector(batch + others, p.get("job"))
    w = f"[{int(p['window_s'])}s]"
    queries = {
        "requests": f"sum by (instance) (increase(sglang:num_requests_total{sel}{w}))",
        "prompt_tokens": f"sum by (instance) (increase(sglang:prompt_tokens_total{sel}{w}))",
        "cached_tokens": f"sum by (instance, cache_source) (increase(sglang:cached_tokens_total{sel}{w}))",
        "aborted": f"sum by (instance) (increase(sglang:num_aborted_requests_total{sel}{w}))",
        "ttft_p50": f"histogram_quantile(0.5, sum by (instance, le) "
                    f"(rate(sglang:time_to_first_token_seconds_bucket{sel}{w})))",
        "ttft_p95": f"histogram_quantile(0.95, sum by (instance, le) "
                    f"(rate(sglang:time_to_first_token_seconds_bucket{sel}{w})))",
        "counter_resets": f"sum by (instance) (resets(sglang:num_requests_total{sel}{w}))",
        "up_changes": f"sum by (instance) (changes(up{sel}{w}))",
        "up": f"min by (instance) (up{sel})",
    }
    if others:
        osel = selector(others, p.get("job"))
        for name, q in (("others_ttft_p50", "0.5"), ("others_ttft_p95", "0.95")):
            queries[name] = (f"histogram_quantile({q}, sum by (le) "
                             f"(rate(sglang:time_to_first_token_seconds_bucket{osel}{w})))")
    return queries


def _number(text: object) -> float | None:
    try:
        value = float(text)  # Prometheus sends values as strings: "1.5", "NaN", "+Inf"
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def prometheus_query(base_url: str, query: str, token: str | None = None, timeout: float = 10.0) -> list[dict]:
    """GET /api/v1/query; the result vector [{metric, value}] or BakeError (never another exception).
    http.client as the probe's client uses it; https checks the certificate with the system's CAs."""
    parsed = urllib.parse.urlsplit(base_url)
    path = parsed.path.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    elif parsed.username is not None:
        pair = f"{urllib.parse.unquote(parsed.username)}:{urllib.parse.unquote(parsed.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    shown = redact_url(base_url)
    kind = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
    try:
        conn = kind(parsed.hostname or "", parsed.port, timeout=timeout)
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            status = resp.status
            body = resp.read(MAX_BODY)
        finally:
            conn.close()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise BakeError(f"Prometheus {shown} not reached: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if status != 200:
        detail = doc.get("error") if isinstance(doc, dict) else None
        raise BakeError(f"Prometheus {shown} answered HTTP {status}"
                        f"{': ' + str(detail)[:300] if detail else ''} to {query}")
    if not isinstance(doc, dict):
        raise BakeError(f"Prometheus {shown} answered something not JSON to {query}")
    if doc.get("status") != "success":
        raise BakeError(f"Prometheus {shown} refused {query}: {str(doc.get('error'))[:300]}")
    data = doc.get("data") or {}
    if data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise BakeError(f"Prometheus {shown} answered a {data.get('resultType')!r}, not a vector, to {query}")
    return data["result"]


def _by_instance(result: list[dict]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for sample in result:
        instance = (sample.get("metric") or {}).get("instance")
        value = sample.get("value") or [None, None]
        if instance is not None:
            out[instance] = _number(value[1] if len(value) > 1 else None)
    return out


def _by_instance_tier(result: list[dict]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for sample in result:
        metric = sample.get("metric") or {}
        value = sample.get("value") or [None, None]
        number = _number(value[1] if len(value) > 1 else None)
        if metric.get("instance") is not None and metric.get("cache_source") in TIERS and number is not None:
            out.setdefault(metric["instance"], {})[metric["cache_source"]] = number
    return out


def _scalar(result: list[dict]) -> float | None:
    for sample in result:
        value = sample.get("value") or [None, None]
        return _number(value[1] if len(value) > 1 else None)
    return None


def run_queries(p: dict, queries: dict[str, str]) -> dict[str, list]:
    return {name: prometheus_query(p["prometheus_url"], q, p.get("bearer_token"), p.get("timeout_s") or 10.0)
            for name, q in queries.items()}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _sum(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def target_figures(raw: dict[str, list], targets: list[str]) -> dict:
    """Pooled figures of some instances (one host's, or the others'), from the per-instance results."""
    requests = _by_instance(raw.get("requests", []))
    prompt = _by_instance(raw.get("prompt_tokens", []))
    aborted = _by_instance(raw.get("aborted", []))
    cached = _by_instance_tier(raw.get("cached_tokens", []))
    resets = _by_instance(raw.get("counter_resets", []))
    changes = _by_instance(raw.get("up_changes", []))
    up = _by_instance(raw.get("up", []))
    p50 = _by_instance(raw.get("ttft_p50", []))
    p95 = _by_instance(raw.get("ttft_p95", []))
    figures: dict = {
        "requests": round(_sum([requests.get(t) for t in targets]) or 0.0, 3),
        "prompt_tokens": round(_sum([prompt.get(t) for t in targets]) or 0.0, 3),
        "aborted_requests": _sum([aborted.get(t) for t in targets]),
        "restarts": sum(max(round(resets.get(t) or 0), math.ceil((changes.get(t) or 0) / 2))
                        for t in targets),
        "down_targets": [t for t in targets if up.get(t) is not None and up[t] < 1],
        "unscraped_targets": [t for t in targets if t not in up],
        "ttft_p50_ms": None, "ttft_p95_ms": None,
        "per_target": {t: {"requests": requests.get(t), "ttft_p50_ms": _ms(p50.get(t)),
                           "ttft_p95_ms": _ms(p95.get(t))} for t in targets},
    }
    worst50 = [v for v in (p50.get(t) for t in targets) if v is not None]
    worst95 = [v for v in (p95.get(t) for t in targets) if v is not None]
    figures["ttft_p50_ms"] = _ms(max(worst50)) if worst50 else None
    figures["ttft_p95_ms"] = _ms(max(worst95)) if worst95 else None
    tiers = {tier: _sum([cached.get(t, {}).get(tier) for t in targets]) for tier in TIERS}
    figures["cached_tokens"] = {tier: round(v, 3) for tier, v in tiers.items() if v is not None}
    total = figures["prompt_tokens"]
    figures["tier_share"] = {tier: round(v / total, 4) for tier, v in tiers.items() if v is not None and total > 0}
    figures["error_rate"] = (round(figures["aborted_requests"] / figures["requests"], 4)
                             if figures["aborted_requests"] is not None and figures["requests"] > 0 else None)
    if figures["aborted_requests"] is not None:
        figures["aborted_requests"] = round(figures["aborted_requests"], 3)
    return figures


def judge_host(item: dict, figures: dict, others: dict | None, p: dict) -> tuple[str, list[str]]:
    """(verdict, reasons): failed beyond a threshold, inconclusive with too little traffic, else passed."""
    t = {**default_thresholds(), **{k: v for k, v in (p.get("thresholds") or {}).items() if v is not None}}
    window = p["window_s"]
    failed: list[str] = []
    notes: list[str] = []
    if figures["unscraped_targets"] and len(figures["unscraped_targets"]) == len(item["targets"]):
        return "inconclusive", [f"Prometheus has no series for {', '.join(figures['unscraped_targets'])} "
                                f"(job {p.get('job') or 'any'}): is the monitoring role scraping this host?"]
    if figures["down_targets"]:
        failed.append(f"not scraped (up 0) at the end of the bake: {', '.join(figures['down_targets'])}")
    if figures["restarts"] > t["max_restarts"]:
        failed.append(f"restarts {figures['restarts']} in {window} s (counter resets, scrape up/down changes), "
                      f"more than max_restarts {t['max_restarts']}")
    if figures["requests"] < p["min_requests"]:
        if failed:
            return "failed", failed
        return "inconclusive", [f"requests {figures['requests']:g} in {window} s, fewer than min_requests "
                                f"{p['min_requests']}: too little traffic to judge"]
    rate = figures["error_rate"]
    if rate is None:
        notes.append("error rate not judged: no sglang:num_aborted_requests_total series")
    elif rate > t["max_error_rate"]:
        failed.append(f"error rate {rate:.2%} ({figures['aborted_requests']:g} aborted of "
                      f"{figures['requests']:g} requests), above max_error_rate {t['max_error_rate']:.2%}")
    p95 = figures["ttft_p95_ms"]
    cold = (item.get("validated") or {}).get("cold_ttft_ms")
    if p95 is not None and cold:
        figures["ttft_p95_vs_validated_cold"] = round(p95 / cold, 3)
        if p95 > cold * t["max_ttft_p95_ratio_validated"]:
            failed.append(f"TTFT p95 {p95:.1f} ms is {p95 / cold:.2f}x its validated cold TTFT {cold:.1f} ms, "
                          f"above max_ttft_p95_ratio_validated {t['max_ttft_p95_ratio_validated']:g}")
    elif cold:
        notes.append("TTFT against the validated cold TTFT not judged: no p95")
    comparable = others is not None and others["requests"] >= p["min_requests"]
    if others is not None and not comparable:
        notes.append(f"not compared with the other hosts: {others['requests']:g} requests there, fewer than "
                     f"min_requests {p['min_requests']}")
    if comparable:
        ref = others.get("ttft_p95_ms")
        if p95 is not None and ref:
            figures["ttft_p95_vs_others"] = round(p95 / ref, 3)
            if p95 > ref * t["max_ttft_p95_ratio_others"]:
                failed.append(f"TTFT p95 {p95:.1f} ms is {p95 / ref:.2f}x the other hosts' {ref:.1f} ms, above "
                              f"max_ttft_p95_ratio_others {t['max_ttft_p95_ratio_others']:g}")
        for tier in TIERS:
            ref_share = others["tier_share"].get(tier)
            if ref_share is None or ref_share < t["min_others_tier_share"]:
                continue
            share = figures["tier_share"].get(tier, 0.0)
            if share < ref_share * t["min_tier_share_ratio"]:
                failed.append(f"{tier}-tier share {share:.1%} of prompt tokens against {ref_share:.1%} on the "
                              f"other hosts, below min_tier_share_ratio {t['min_tier_share_ratio']:g} of theirs")
    if failed:
        return "failed", failed
    return "passed", notes


def decide(verdicts: list[str], no_traffic: str) -> tuple[str, str]:
    """(overall verdict, action): action rollback (failed), continue, hold or warm (inconclusive, by
    no_traffic: pass continues, hold stops the run there, warm sends the warm set and bakes again)."""
    if "failed" in verdicts:
        return "failed", "rollback"
    if "inconclusive" in verdicts or not verdicts:
        return "inconclusive", {"pass": "continue", "hold": "hold", "warm": "warm"}[no_traffic]
    return "passed", "continue"


def bake(p: dict) -> dict:
    """The bake: query, judge every batch host, decide. Never raises on a Prometheus error."""
    queries = build_queries(p)
    hosts: dict[str, dict] = {}
    others_figures = None
    error = None
    try:
        raw = run_queries(p, queries)
    except BakeError as exc:
        error = str(exc)
        raw = {}
    if error is None and p.get("others"):
        others_figures = target_figures(raw, list(p["others"]))
        others_figures.pop("per_target", None)
        others_figures["ttft_p50_ms"] = _ms(_scalar(raw.get("others_ttft_p50", [])))
        others_figures["ttft_p95_ms"] = _ms(_scalar(raw.get("others_ttft_p95", [])))
    for item in p["instances"]:
        if error is not None:
            hosts[item["host"]] = {"verdict": "inconclusive", "figures": {}, "reasons": [error],
                                   "validated": dict(item.get("validated") or {})}
            continue
        figures = target_figures(raw, list(item["targets"]))
        verdict, reasons = judge_host(item, figures, others_figures, p)
        hosts[item["host"]] = {"verdict": verdict, "figures": figures, "reasons": reasons,
                               "validated": dict(item.get("validated") or {})}
    verdict, action = decide([h["verdict"] for h in hosts.values()], p.get("no_traffic") or "hold")
    result = {
        "verdict": verdict, "action": action, "no_traffic": p.get("no_traffic") or "hold",
        "window_s": p["window_s"], "hosts": hosts, "others": others_figures, "error": error,
        "failed_hosts": [h for h, v in hosts.items() if v["verdict"] == "failed"],
        "inconclusive_hosts": [h for h, v in hosts.items() if v["verdict"] == "inconclusive"],
        "queries": queries,
    }
    result["msg"] = summary(result)
    return result


def summary(result: dict) -> str:
    parts = []
    for host, entry in result["hosts"].items():
        reason = f" ({entry['reasons'][0]})" if entry["verdict"] != "passed" and entry["reasons"] else ""
        parts.append(f"{host} {entry['verdict']}{reason}")
    tail = ""
    if result["verdict"] == "inconclusive":
        tail = f"; no_traffic {result['no_traffic']}: {result['action']}"
    return f"bake {result['verdict']} over {result['window_s']} s: " + "; ".join(parts) + tail
