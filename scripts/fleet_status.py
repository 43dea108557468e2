#!/usr/bin/env python3
"""The fleet at a glance (playbooks/status.yml): per instance the running release, validated or not
and since when, the last probe figures, cache hits by tier from its /metrics, the router's view;
Markdown plus a PNG chart, a one-line verdict on top.

    fleet_status.py DIR     reads DIR/status.json (collected by playbooks/status.yml), writes
                            DIR/status.md and DIR/status.png, prints the Markdown
"""

from __future__ import annotations

import base64
import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$')


def parse_metrics(text: str) -> dict[str, float]:
    """The sums status reads off an SGLang /metrics exposition (all label sets added up)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        name, labels = match["name"], match["labels"] or ""
        key = {
            "sglang:cached_tokens_total": "cached_" + (re.search(r'cache_source="([^"]*)"', labels) or [None, "?"])[1],
            "sglang:prompt_tokens_total": "prompt",
            "sglang:hicache_host_used_tokens": "host_used",
            "sglang:hicache_host_total_tokens": "host_total",
            "sglang:time_to_first_token_seconds_count": "ttft_count",
            "sglang:time_to_first_token_seconds_sum": "ttft_sum",
            "sglang:num_queue_reqs": "queued",
        }.get(name)
        if key:
            out[key] = out.get(key, 0.0) + float(match["value"])
    return out


def _record(b64: str | None) -> dict[str, Any]:
    if not b64:
        return {}
    try:
        record = json.loads(base64.b64decode(b64))
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _pct(part: float | None, whole: float | None) -> float | None:
    return None if not whole or part is None else 100.0 * part / whole


def instance_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    router = {str(w.get("url", "")).rstrip("/"): w for w in (status.get("router") or {}).get("workers") or []}
    router_known = bool(status.get("router"))
    rows = []
    for host in status["hosts"]:
        record = _record(host.get("record"))
        since = host.get("record_mtime")
        for endpoint, current, text, code in zip(host["endpoints"], host["current"], host["metrics"],
                                                 host["metrics_status"], strict=True):
            inst = {"instance": endpoint["instance"], "target": endpoint["target"],
                    "current": (current or {}).get("lnk_source"),
                    "metrics": text if code == 200 else None}
            entry = (record.get("instances") or {}).get(inst["instance"]) or {}
            probe = entry.get("probe") or {}
            warm = (probe.get("warm") or {}).get("host") or (probe.get("warm") or {}).get("device") or {}
            release = Path(inst["current"]).name if inst.get("current") else None
            validated = bool(release) and release == entry.get("config_hash")
            metrics = parse_metrics(inst["metrics"]) if inst.get("metrics") else None
            worker = router.get(f"http://{inst['target']}")
            rows.append({
                "host": host["host"], "instance": inst["instance"], "target": inst["target"],
                "release": release, "validated": validated,
                "validated_release": entry.get("config_hash"),
                "since": datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%d %H:%M UTC") if since and entry else None,
                "cold_ms": (probe.get("cold") or {}).get("median_ttft_ms"), "warm_ms": warm.get("median_ttft_ms"),
                "reachable": metrics is not None, "metrics": metrics or {},
                "device_pct": _pct((metrics or {}).get("cached_device", 0.0), (metrics or {}).get("prompt")),
                "host_pct": _pct((metrics or {}).get("cached_host", 0.0), (metrics or {}).get("prompt")),
                "pool_pct": _pct((metrics or {}).get("host_used"), (metrics or {}).get("host_total")),
                "router": None if not router_known else ("missing" if worker is None else
                                                         "healthy" if worker.get("is_healthy") else "unhealthy"),
            })
    return rows


def problems(rows: list[dict[str, Any]], status: dict[str, Any]) -> list[str]:
    found = []
    for r in rows:
        name = f"{r['host']}/{r['instance']}"
        if not r["reachable"]:
            found.append(f"{name}: /metrics does not answer")
        m = r["metrics"]
        hicache_idle = m.get("host_total") and m.get("cached_device") and not m.get("cached_host")
        if r["reachable"] and m.get("prompt") and hicache_idle:
            found.append(f"{name}: HiCache on but no token ever came from the host tier")
        if r["release"] is None:
            found.append(f"{name}: running release unknown")
        elif not r["validated"]:
            found.append(f"{name}: runs release {r['release'][:12]}, not the validated one")
        if r["router"] in ("missing", "unhealthy"):
            found.append(f"{name}: {r['router']} in the router")
    if (status.get("router") or {}).get("error"):
        found.append(f"router: {status['router']['error']}")
    return found


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}{unit}"


def status_markdown(status: dict[str, Any], rows: list[dict[str, Any]], chart: str | None) -> str:
    issues = problems(rows, status)
    n = len(rows)
    verdict = (f"**all {n} instances serve their validated release, answer, and use their cache tiers**"
               if not issues else f"**{len(issues)} problem(s)**: " + "; ".join(issues))
    lines = [f"# hicache-fleet status {status.get('time', '')}", "",
             f"Inventory: `{status.get('inventory', '?')}` · instances: {n} · verdict: {verdict}", ""]
    if status.get("note"):
        lines += [f"> {status['note']}", ""]
    lines += [
        "| instance | release | validated (since) | probe cold / warm TTFT | cached from GPU / host RAM"
        " | host pool used | router |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        release = f"`{r['release'][:12]}`" if r["release"] else "unknown"
        if r["validated"]:
            valid = f"yes ({r['since']})"
        elif r["validated_release"]:
            valid = f"no: validated `{r['validated_release'][:12]}` ({r['since']})"
        else:
            valid = "never"
        hits = (f"{_fmt(r['device_pct'], ' %')} / {_fmt(r['host_pct'], ' %')}" if r["reachable"] else "no answer")
        lines.append(f"| {r['host']}/{r['instance']} ({r['target']}) | {release} | {valid} | "
                     f"{_fmt(r['cold_ms'], ' ms')} / {_fmt(r['warm_ms'], ' ms')} | {hits} | "
                     f"{_fmt(r['pool_pct'], ' %')} | {r['router'] or 'no router'} |")
    lines += ["", "Cache shares are of all prompt tokens since each server started (its /metrics counters)."]
    if chart:
        lines += ["", f"chart: {chart}"]
    return "\n".join(lines) + "\n"


def status_chart(path: Path, rows: list[dict[str, Any]]) -> None:
    """Stacked bars per instance: the share of prompt tokens from the GPU cache, from host RAM, computed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['host']}/{r['instance']}" for r in rows]
    device = [r["device_pct"] or 0.0 for r in rows]
    host = [r["host_pct"] or 0.0 for r in rows]
    computed = [max(0.0, 100.0 - d - h) if r["reachable"] else 0.0 for d, h, r in zip(device, host, rows, strict=True)]
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.5 * len(rows)))
    left = [0.0] * len(rows)
    for name, values, colour in (("GPU cache", device, "#9bbb59"), ("host RAM (HiCache)", host, "#4f81bd"),
                                 ("computed", computed, "#c0504d")):
        ax.barh(labels, values, left=left, label=name, color=colour)
        for i, value in enumerate(values):
            if value >= 6:
                ax.text(left[i] + value / 2, i, f"{value:.0f} %", va="center", ha="center", fontsize=9, color="white")
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.set_xlabel("share of prompt tokens since start, %")
    ax.set_title("Where each instance's prompt tokens came from")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(args[0])
    status = json.loads((out / "status.json").read_text(encoding="utf-8"))
    rows = instance_rows(status)
    chart = out / "status.png"
    status_chart(chart, rows)
    text = status_markdown(status, rows, str(chart))
    (out / "status.md").write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
