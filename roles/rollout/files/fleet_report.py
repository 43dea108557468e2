#!/usr/bin/env python3
"""Controller-side reports: the per-run rollout report and the seed's A/B table, each as JSON,
Markdown and a PNG bar chart of TTFT ("shorter is better").

    fleet_report.py rollout RUN_DIR     reads RUN_DIR/hosts/*.json (one record per host, written by
                                        roles/rollout's gate or rollback), RUN_DIR/run.json and, once the run
                                        ended, RUN_DIR/outcome.json (callback_plugins/
                                        rollout_outcome.py); writes RUN_DIR/rollout.{json,md,png}
    fleet_report.py ab RECORD_JSON      reads the A/B record (playbooks/ab_benchmark.yml), writes
                                        .md and .png beside it

Shipped with roles/rollout, which runs it (tasks/report.yml, tasks/ab_report.yml; run.json's
report_command for callback_plugins/rollout_outcome.py). Runs with the controller venv's Python
(matplotlib is pinned in requirements/controller.txt).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

# Text from a server or a host (error bodies, gate reasons, worker ids, model names) reaches the
# Markdown report and the terminal: control characters (CR, ESC, NUL, bidi overrides) become spaces,
# and Markdown's and HTML's specials are escaped, so it reads as the text it is.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# Markdown's specials where they would make markup: backslash, backtick, *, [ ], ~ anywhere; _ at a
# word's edge (snake_case names stay readable); < before what would open an HTML tag; | in table cells.
_MD_SPECIAL = re.compile(r"([\\`*\[\]~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])|<(?=[A-Za-z/!?]))")


def plain(value: Any) -> str:
    """value as one line of text without control characters."""
    return " ".join(_UNSAFE.sub(" ", str(value)).split())


def md(value: Any, cell: bool = False) -> str:
    """value as Markdown text that shows its characters (no control characters, no markup); cell:
    for a table cell (| escaped too)."""
    text = _MD_SPECIAL.sub(r"\\\1", plain(value))
    if text[:1] in ("#", ">", "-", "+", "="):
        text = "\\" + text
    return text.replace("|", "\\|") if cell else text


def code(value: Any) -> str:
    """value for inside a `code span`: no control characters, no backtick to end the span."""
    return plain(value).replace("`", "'")


VERDICT_ORDER = {"failed": 0, "rolled back": 0, "passed": 1, "unchanged": 2}


def load_host_records(run_dir: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted((run_dir / "hosts").glob("*.json")):
        with path.open() as handle:
            records.append(json.load(handle))
    records.sort(key=lambda r: (r.get("order", 0), r.get("host", "")))
    return records


def _ms(value: Any) -> str:
    if value is None:
        return "–"
    value = float(value)
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.1f} ms"


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * float(value):.1f} %"


def _prompt(input_len: Any) -> str:
    return f", {int(input_len) // 1000}K prompt" if input_len else ""


def host_row(record: dict[str, Any]) -> dict[str, Any]:
    """The figures of one host's probe, flattened for the table and the chart."""
    probe = record.get("probe") or {}
    cold = probe.get("cold") or {}
    warm = probe.get("warm") or {}
    # Prefer the host tier (what proves HiCache), else the device tier.
    tier = "host" if "host" in warm else ("device" if "device" in warm else None)
    warm_case = warm.get(tier) or {}
    gate = probe.get("gate") or {}
    return {
        "host": record.get("host"),
        "verdict": record.get("verdict"),
        "config_hash": (record.get("config_hash") or "")[:12],
        "cold_ttft_ms": cold.get("median_ttft_ms"),
        "warm_tier": tier,
        "warm_ttft_ms": warm_case.get("median_ttft_ms"),
        "warm_cold_ratio": warm_case.get("warm_cold_ratio"),
        "speedup": warm_case.get("speedup"),
        "cached_fraction": warm_case.get("cached_fraction"),
        "host_cached_fraction": warm_case.get("host_cached_fraction"),
        "reasons": list(gate.get("reasons") or record.get("reasons") or []),
        "note": record.get("note", ""),
        "router": list(record.get("router") or []),
        "input_len": probe.get("input_len"),
        "pools": probe.get("pools") or {},
        "parity": gate.get("parity") if isinstance(gate.get("parity"), str) else None,
        "warm": record.get("warm") if isinstance(record.get("warm"), dict) else {},
        "restart_hit": probe.get("restart_hit") if isinstance(probe.get("restart_hit"), dict) else {},
        "storage": warm.get("storage") if isinstance(warm.get("storage"), dict) else {},
        "bake": record.get("bake") if isinstance(record.get("bake"), dict) else {},
    }


def storage_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 27 item 2: with the L3 tier, per host: the prefix it served before its restart, read
    first after it (tokens from storage, TTFT), and the storage tier's own read (flushed, re-read)."""
    lines = []
    for row in rows:
        hit, case = row.get("restart_hit") or {}, row.get("storage") or {}
        if not hit and not case:
            continue
        before = (f"{int(hit.get('storage_cached_tokens') or 0):,} of {int(hit.get('prompt_tokens') or 0):,} tokens "
                  f"from storage, TTFT {_ms(hit.get('ttft_ms'))}") if hit else "–"
        flushed = (f"{_pct(case.get('storage_cached_fraction'))} from storage, TTFT {_ms(case.get('median_ttft_ms'))}"
                   if case else "–")
        lines.append(f"| {md(row['host'], True)} | {md(before, True)} | {md(flushed, True)} |")
    if not lines:
        return []
    return ["", "## L3 storage tier", "", "| host | served before the restart, read first | flushed and re-read |",
            "|---|---|---|", *lines]


def warm_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 27 item 3: per host and instance, what its warm set made warm before it rejoined the
    router (tokens sent, of them already cached, seconds) and the files that failed (never a failure
    of the host)."""
    lines = []
    for row in rows:
        for name, warm in sorted((row.get("warm") or {}).items()):
            if not isinstance(warm, dict):
                continue
            seconds = warm.get("seconds")
            took = "–" if not isinstance(seconds, (int, float)) else f"{float(seconds):.1f} s"
            failed = warm.get("failed_files") or []
            lines.append(
                f"| {md(row['host'], True)} | {md(name, True)} | {int(warm.get('warm_tokens') or 0):,} | "
                f"{int(warm.get('cached_tokens') or 0):,} | {took} | "
                f"{md(', '.join(map(str, failed)), True) if failed else '–'} |"
            )
    if not lines:
        return []
    return ["", "## Warm rejoin", "", "| host | instance | tokens sent | cached on send | took | failed files |",
            "|---|---|---|---|---|---|", *lines]


def _shares(shares: Any) -> str:
    if not isinstance(shares, dict) or not shares:
        return "–"
    return " / ".join(f"{tier} {_pct(shares.get(tier))}" for tier in ("device", "host", "storage") if tier in shares)


def bake_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 28 item 1: per host its bake (live traffic after it rejoined, from the fleet's Prometheus)
    beside its probe: TTFT p50/p95 live against the probe's cold and warm TTFT and the other hosts'
    p95, the share of prompt tokens from each tier, errors, restarts, the verdict and what the run did
    (rolled back, held or passed by rollout_bake_no_traffic), with the reasons."""
    rows = [row for row in rows if row.get("bake")]
    if not rows:
        return []
    lines = ["", "## Bake (live traffic after the batch rejoined)", "",
             "| host | bake | live TTFT p50 / p95 | probe cold / warm TTFT | other hosts' p95 | prompt tokens from "
             "(device / host / storage) | errors | restarts | requests | window | no traffic |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for row in rows:
        bake = row["bake"]
        figures = bake.get("figures") or {}
        others = bake.get("others") or {}
        rate = figures.get("error_rate")
        errors = "–" if rate is None else f"{_pct(rate)} ({float(figures.get('aborted_requests') or 0):g})"
        window = bake.get("window_s")
        lines.append(
            f"| {md(row['host'], True)} | {md(bake.get('outcome') or bake.get('verdict') or '?', True)} | "
            f"{_ms(figures.get('ttft_p50_ms'))} / {_ms(figures.get('ttft_p95_ms'))} | "
            f"{_ms(row.get('cold_ttft_ms'))} / {_ms(row.get('warm_ttft_ms'))} | {_ms(others.get('ttft_p95_ms'))} | "
            f"{md(_shares(figures.get('tier_share')), True)} | {errors} | {figures.get('restarts', '–')} | "
            f"{float(figures.get('requests') or 0):.0f} | {'–' if window is None else f'{window} s'} | "
            f"{md(bake.get('no_traffic') or '–', True)} |"
        )
        notes += [f"- **{md(row['host'])}**: {md(reason)}" for reason in bake.get("reasons") or []]
        if bake.get("error"):
            notes.append(f"- **{md(row['host'])}**: Prometheus: {md(bake['error'])}")
    return lines + (["", *notes] if notes else [])


def parity_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 25 item 1: each probed host's answer parity in one line (the probe's gate.parity, e.g.
    `parity: 8 tokens equal (device tier, host tier)`), escaped like every recorded text."""
    rows = [row for row in rows if row.get("parity")]
    if not rows:
        return []
    return ["", "## Answer parity", "",
            *(f"- **{md(row['host'])}**: {md(row['parity'])}" for row in rows)]


def pool_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 25 item 2: each host's GPU KV capacity and host pool as the server reported them after
    start, and the capacity against the host's baseline (HiCache's cost against one without it)."""
    rows = [row for row in rows if (row.get("pools") or {}).get("device_tokens")]
    if not rows:
        return []
    lines = ["", "## KV pools", "", "| host | GPU KV (tokens/rank) | host pool (tokens/rank) | against the baseline |",
             "|---|---|---|---|"]
    for row in rows:
        pools = row["pools"]
        host = pools.get("host_tokens")
        expected = pools.get("host_expected")
        host_text = "–" if host is None else f"{int(host):,}"
        if host is not None and isinstance(expected, list) and len(expected) == 2:
            low, high = expected
            host_text += f" (plan {int(low):,})" if low == high else f" (plan {int(low):,}–{int(high):,})"
        cost = pools.get("hicache_cost") or {}
        if cost:
            kind = "with HiCache" if cost.get("baseline_hicache") else "without HiCache"
            against = (f"{float(cost['change_pct']):+.1f} % vs {int(cost['baseline_device_tokens']):,} "
                       f"({kind})")
        else:
            against = "–"
        device = f"{int(pools['device_tokens']):,}"
        lines.append(f"| {md(row['host'], True)} | {device} | {host_text} | {against} |")
    return lines


def rollout_markdown(run: dict[str, Any], rows: list[dict[str, Any]], locks: list[str] | None = None) -> str:
    lines = [
        f"# hicache-fleet rollout {md(run.get('run_id', ''))}",
        "",
        f"Inventory: `{code(run.get('inventory', '?'))}` · hosts reported: "
        f"{sum(row['verdict'] not in ('not reached', 'unreachable') for row in rows)} · "
        f"verdict: **{md(run.get('verdict', '?'))}**",
        "",
        # The webhook's answer (callback_plugins/rollout_outcome.py, rollout_notify_url).
        *([f"notify: {md(run['notify'])}", ""] if run.get("notify") else []),
        *([f"> {md(run['note'])}", ""] if run.get("note") else []),
        "Each host was probed like the field report's A/B: a cold read of random token ids (a random "
        "block repeated) after flushing the cache, then the same prefix again (for the host tier, after "
        "pushing it out of GPU memory). A host passes when the warm read is fast, the server reports the "
        "tokens as cached and the warm read answers what the cold one did (greedy).",
        "",
        "| host | verdict | cold TTFT | warm TTFT (tier) | warm/cold | speedup | cached | from host RAM | config |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        speed = "–" if row["speedup"] is None else f"{float(row['speedup']):.1f}×"
        ratio = "–" if row["warm_cold_ratio"] is None else f"{float(row['warm_cold_ratio']):.4f}"
        lines.append(
            f"| {md(row['host'], True)} | {md(row['verdict'], True)} | {_ms(row['cold_ttft_ms'])} | "
            f"{_ms(row['warm_ttft_ms'])} ({md(row['warm_tier'] or '–', True)}) | {ratio} | {speed} | "
            f"{_pct(row['cached_fraction'])} | {_pct(row['host_cached_fraction'])} | `{code(row['config_hash'])}` |"
        )
    problems = [row for row in rows if row["reasons"] or row["note"]]
    if problems:
        lines += ["", "## Notes", ""]
        for row in problems:
            for reason in row["reasons"]:
                lines.append(f"- **{md(row['host'])}**: {md(reason)}")
            if row["note"]:
                lines.append(f"- **{md(row['host'])}**: {md(row['note'])}")
    lines += pool_lines(rows)
    lines += parity_lines(rows)
    lines += storage_lines(rows)
    lines += warm_lines(rows)
    lines += bake_lines(rows)
    moves = [row for row in rows if row["router"]]
    if moves:
        lines += ["", "## Router rotation", ""]
        lines += [f"- **{md(row['host'])}**: " + "; ".join(md(move) for move in row["router"]) for row in moves]
    if locks:
        lines += ["", "## Run lock", "", *locks]
    return "\n".join(lines) + "\n"


LOG_AXIS_SPAN = 10.0  # bars further apart than this (longest / shortest) get a log axis


def chart_axis(values: list[float | None]) -> tuple[str, float, float]:
    """("linear" or "log", left limit, right limit) in seconds for bars of these TTFTs (ms).

    A warm read 60x shorter than the cold one is a sliver on a linear axis; past LOG_AXIS_SPAN the
    axis is logarithmic, so every bar is long enough to see and to carry its figure."""
    shown = [v / 1000 for v in values if v is not None and v > 0]
    top = max(shown, default=1.0)
    low = min(shown, default=top)
    if top / low < LOG_AXIS_SPAN:
        return "linear", 0.0, top * 1.25
    left = 10 ** math.floor(math.log10(low / 2))
    return "log", left, top * 4


def ttft_chart(
    path: Path,
    title: str,
    labels: list[str],
    series: dict[str, list[float | None]],
    colours: dict[str, str] | None = None,
) -> None:
    """Grouped horizontal bars of TTFT in seconds per label; each bar carries its figure.
    A series takes its colour from `colours` by the first word of its name. The axis turns
    logarithmic when the bars differ more than LOG_AXIS_SPAN times (chart_axis).
    The chart's inputs are kept as a digest in the PNG (a tEXt chunk): when the file there was drawn
    from the same inputs, it is left as it is. The run report is rendered again after every host and
    at the end of the run, and drawing (matplotlib) is most of what a render costs the controller."""
    digest = chart_digest(title, labels, series, colours)
    if png_text(path).get(CHART_DIGEST_KEY) == digest:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = colours or {"cold": "#c0504d", "warm": "#4f81bd"}
    n_series = max(len(series), 1)
    height = 0.8 / n_series
    fig, ax = plt.subplots(figsize=(8, 1.8 + 0.6 * len(labels) * n_series))
    scale, left, right = chart_axis([v for values in series.values() for v in values])
    for index, (name, values) in enumerate(series.items()):
        ys = [i + index * height for i in range(len(labels))]
        ends = [max((v or 0.0) / 1000, left) for v in values]
        colour = colours.get(name.split()[0], None)
        bars = ax.barh(ys, [end - left for end in ends], left=left, height=height * 0.9, label=name, color=colour)
        for bar, end, value in zip(bars, ends, values, strict=True):
            text = "n/a" if value is None else _ms(value)
            x = end * 1.05 if scale == "log" else end + right * 0.008
            ax.text(x, bar.get_y() + bar.get_height() / 2, " " + text, va="center", fontsize=9)
    ax.set_yticks([i + height * (n_series - 1) / 2 for i in range(len(labels))], labels)
    ax.invert_yaxis()
    ax.set_xscale(scale)
    ax.set_xlabel("time to first token, seconds, "
                  + ("log scale (each step is 10x) " if scale == "log" else "") + "(shorter is better)")
    ax.set_xlim(left, right)
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=n_series, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={CHART_DIGEST_KEY: digest})
    plt.close(fig)


# The tEXt keyword under which ttft_chart keeps the digest of what it drew.
CHART_DIGEST_KEY = "hicache-fleet chart inputs"


def chart_digest(title: str, labels: list[str], series: dict[str, list[float | None]],
                 colours: dict[str, str] | None) -> str:
    """sha256 of everything ttft_chart draws from (and the version of its drawing code)."""
    data = json.dumps([CHART_VERSION, title, labels, series, colours], sort_keys=True, default=str)
    return hashlib.sha256(data.encode()).hexdigest()


# Raise it when ttft_chart draws differently: charts drawn by the earlier code are drawn again.
CHART_VERSION = 1


def png_text(path: Path) -> dict[str, str]:
    """The tEXt chunks of a whole PNG file: {} for a missing or unreadable file, and for one without
    its closing IEND chunk (a write cut short keeps the early tEXt chunk but not the image, and must
    not count as drawn)."""
    try:
        data = path.read_bytes()
    except OSError:
        return {}
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return {}
    found: dict[str, str] = {}
    pos = 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if len(body) < length:
            return {}
        if kind == b"IEND":
            return found
        if kind == b"tEXt" and b"\0" in body:
            key, _, value = body.partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + length
    return {}


def _ended_early(host: str, state: dict[str, Any]) -> dict[str, Any]:
    """The record of a host that wrote none: it failed or was unreachable before reporting."""
    verdict = "unreachable" if state.get("unreachable") else "failed"
    task = state.get("task") or "?"
    detail = state.get("msg") or "no detail"
    return {"host": host, "verdict": verdict, "probe": {}, "reasons": [f"{verdict} at task '{task}': {detail}"]}


def rollout_outcome(
    run: dict[str, Any], records: list[dict[str, Any]], outcome: dict[str, Any] | None,
    paused: dict[str, Any] | None = None,
) -> tuple[str, list[dict[str, Any]], list[str]]:
    """The run's verdict, the records of hosts that wrote none (failed or unreachable before their
    report), and the hosts the run never reached. Without an outcome (the run has not ended, or
    ended without the callback), hosts still missing are "not reached yet" and the run in progress.
    A run paused for a person (paused.json, roles/rollout tasks/pause.yml) that stopped nowhere else
    is "paused", with the hosts left and the command that continues."""
    states = (outcome or {}).get("hosts") or {}
    reported = {r.get("host") for r in records}
    missing = [h for h in run.get("hosts") or [] if h not in reported]
    ended = [
        _ended_early(h, states[h])
        for h in missing
        if states.get(h, {}).get("unreachable") or states.get(h, {}).get("failed")
    ]
    not_reached = [h for h in missing if h not in {r["host"] for r in ended}]
    # A host that reported and then was lost (e.g. unreachable after its gate) says so too.
    for record in records:
        state = states.get(record.get("host")) or {}
        if state.get("unreachable") and record.get("verdict") not in ("rolled back", "failed"):
            record.setdefault("reasons", []).append(
                f"unreachable afterwards, at task '{state.get('task') or '?'}': {state.get('msg') or 'no detail'}"
            )
    what = {"rolled back": "failed and was rolled back", "failed": "failed", "unreachable": "was unreachable"}
    stops = [
        f"{r['host']} {what[r['verdict']]}"
        for r in sorted([*records, *ended], key=lambda r: r.get("order", 0))
        if r.get("verdict") in what
    ]
    stops += [
        f"{r['host']} was unreachable"
        for r in records
        if (states.get(r.get("host")) or {}).get("unreachable") and r.get("verdict") not in what
    ]
    left = [h for h in (paused or {}).get("left") or [] if h in not_reached]
    held = (paused or {}).get("bake") if isinstance((paused or {}).get("bake"), dict) else None
    if run.get("check_mode") in (True, "True", "true"):
        verdict = "check mode: nothing was restarted, probed or validated"
    elif held and not stops:
        # The bake could not judge a batch (too little traffic) and rollout_bake_no_traffic=hold.
        verdict = (
            f"held after batch {paused.get('after_batch', '?')}: bake inconclusive on "
            f"{', '.join(map(str, held.get('hosts') or [])) or '?'} "
            f"(rollout_bake_no_traffic={held.get('no_traffic', 'hold')}: too little traffic to judge)"
        )
        if left:
            verdict += f"; not started: {', '.join(left)}; continue with: {paused.get('command', '?')}"
        not_reached = [h for h in not_reached if h not in left]
    elif paused and not stops and left:
        verdict = (
            f"paused after batch {paused.get('after_batch', '?')} "
            f"(rollout_pause_after={paused.get('pause_after', '?')}): "
            f"not started: {', '.join(left)}; continue with: {paused.get('command', '?')}"
        )
        not_reached = [h for h in not_reached if h not in left]
    elif stops or (outcome is not None and not_reached):
        verdict = "halted: " + "; ".join(stops or ["the run ended early"])
        if not_reached:
            verdict += "; not reached: " + ", ".join(not_reached)
    elif not_reached:
        verdict = "in progress: not reached yet: " + ", ".join(not_reached)
    elif records:
        verdict = "every host passed or was already validated"
        # An inconclusive bake that rollout_bake_no_traffic=pass let through is said, never hidden.
        passed_by_setting = [r.get("host") for r in records
                             if isinstance(r.get("bake"), dict) and r["bake"].get("batch_verdict") == "inconclusive"
                             and r["bake"].get("action") == "continue"]
        if passed_by_setting:
            verdict += (f"; bake inconclusive on {', '.join(map(str, passed_by_setting))}, passed by "
                        "rollout_bake_no_traffic=pass")
    else:
        verdict = "no host reported"
    return verdict, ended, not_reached


def lock_lines(run: dict[str, Any], outcome: dict[str, Any] | None) -> list[str]:
    """What the run lock did: stale locks taken over, locks the run could not release."""
    lines = [f"- taken over: {md(warning)}" for warning in run.get("lock_warnings") or []]
    locks = (outcome or {}).get("locks") or {}
    if locks.get("left"):
        lines.append(
            "- not released (still this run's lock): " + ", ".join(md(host) for host in locks["left"]) + ". The next "
            f"run from {md((run.get('lock') or {}).get('controller', 'this controller'))} takes them over "
            "(this run's pid is gone); from another controller, add `-e rollout_lock_break=true`."
        )
    return lines


# The keys of a run lock record (roles/rollout/filter_plugins/rollout_lock.py, library/fleet_run_lock.py).
LOCK_FIELDS = ("owner", "controller", "controller_id", "pid", "pid_start", "run_id", "started", "started_epoch",
               "playbooks")


def write_private(path: Path, text: str) -> None:
    """Write a run file readable by its owner only (0600), whatever the umask; a symlink there is
    replaced, never followed."""
    if path.is_symlink():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def cmd_rollout(run_dir: Path) -> int:
    records = load_host_records(run_dir)
    meta_path = run_dir / "run.json"
    run = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    # Only the lock's record fields: a run.json of an older version kept the command line (with any
    # -e value) in its lock; it never reaches the report.
    if isinstance(run.get("lock"), dict):
        run["lock"] = {key: value for key, value in run["lock"].items() if key in LOCK_FIELDS}
    outcome_path = run_dir / "outcome.json"
    outcome = json.loads(outcome_path.read_text()) if outcome_path.exists() else None
    paused_path = run_dir / "paused.json"
    paused = json.loads(paused_path.read_text()) if paused_path.exists() else None
    run["verdict"], ended, not_reached = rollout_outcome(run, records, outcome, paused)
    run["not_reached"] = not_reached
    run["paused"] = paused
    waiting = [h for h in (paused or {}).get("left") or [] if h not in {r.get("host") for r in [*records, *ended]}
               and h not in not_reached] if run["verdict"].startswith(("paused", "held")) else []
    if (outcome or {}).get("notify"):
        run["notify"] = str(outcome["notify"])
    order = {host: index for index, host in enumerate(run.get("hosts") or [])}
    table = sorted(
        [*records, *ended, *({"host": h, "verdict": "not reached", "probe": {}} for h in not_reached),
         *({"host": h, "verdict": f"{run['verdict'].split()[0]}: not started", "probe": {}} for h in waiting)],
        key=lambda r: order.get(r.get("host"), r.get("order", 0)),
    )
    rows = [host_row(r) for r in table]
    write_private(
        run_dir / "rollout.json",
        json.dumps({"run": run, "hosts": records, "unreported": ended, "outcome": outcome}, indent=2) + "\n",
    )
    (run_dir / "rollout.md").write_text(rollout_markdown(run, rows, lock_lines(run, outcome)))
    probed = [row for row in rows if row["cold_ttft_ms"] is not None]
    if probed:
        ttft_chart(
            run_dir / "ttft.png",
            "TTFT per host: cold read vs the same prefix again",
            [f"{row['host']} ({row['verdict']}{_prompt(row['input_len'])})" for row in probed],
            {
                "cold (cache flushed)": [row["cold_ttft_ms"] for row in probed],
                "warm (same prefix)": [row["warm_ttft_ms"] for row in probed],
            },
        )
    print((run_dir / "rollout.md").read_text(), end="")
    if probed:
        print(f"\nchart: {run_dir / 'ttft.png'}")
    return 0


AB_TIERS = {
    "cold": "cold\n(cache flushed)",
    "device": "warm\n(prefix still in GPU)",
    "host": "warm\n(prefix pushed out of GPU)",
}
AB_SERIES = {False: "baseline (no HiCache args)", True: "HiCache (same launch + HiCache args)"}
AB_COLOURS = {"baseline": "#9e9e9e", "HiCache": "#2e75b6"}


def _capacity_change(cases: list[dict[str, Any]]) -> tuple[int | None, int | None, float | None]:
    """GPU KV capacity without and with HiCache, and the relative change."""
    base = next((c.get("max_total_num_tokens") for c in cases if c.get("hicache") is False), None)
    on = next((c.get("max_total_num_tokens") for c in cases if c.get("hicache") is True), None)
    change = (on - base) / base if base and on else None
    return base, on, change


def _cached(case: dict[str, Any]) -> str:
    """Share of the prompt the server reported as cached, and how much of it came from host RAM."""
    if case.get("cached_fraction") is None:
        return "–"
    text = _pct(case["cached_fraction"])
    if case.get("host_cached_fraction"):
        text += f" ({_pct(case['host_cached_fraction'])} from host RAM)"
    return text


def _ab_release_lines(record: dict[str, Any]) -> list[str]:
    """The release the A/B ran on (and put the host back on), and how each launch relates to it."""
    release = record.get("release")
    if not release:
        return []
    found = str(release.get("config_hash", ""))[:12]
    hashes = {arm: str(value)[:12] for arm, value in (record.get("config_hashes") or {}).items()}
    same = [arm for arm, value in hashes.items() if value == found]
    line = (
        f"Ran on the release the host served, config `{code(found)}`: python `{code(release.get('python', '?'))}`, "
        f"model `{code(release.get('model', '?'))}`"
        + (f", draft `{code(release['draft'])}`" if release.get("draft") else "")
        + ". Launch configs: "
        + ", ".join(f"{md(arm)} `{code(value)}`" for arm, value in hashes.items())
        + (f" ({' and '.join(same)} = the served release)" if same else " (neither is the served release as is)")
        + ". The playbook puts the host back on that release and checks that it serves it."
    )
    return [line, ""]


def ab_markdown(record: dict[str, Any]) -> str:
    cases = record.get("cases", [])
    base_cap, _, _ = _capacity_change(cases)
    with_cache = any("cached_fraction" in c for c in cases)
    lines = [
        f"# HiCache A/B on {md(record.get('host', '?'))}",
        "",
        "Launch commands identical except for the HiCache arguments; cold = cache flushed, "
        f"{record.get('input_len', '?')} random input ids; warm = the same ids again. "
        f"Medians of {record.get('repeats', '?')} runs.",
        "",
        *_ab_release_lines(record),
        "| case | TTFT | input throughput | E2E | GPU KV capacity (tokens) | capacity change |"
        + (" cached (server's cache report) |" if with_cache else ""),
        "|---|---|---|---|---|---|" + ("---|" if with_cache else ""),
    ]
    for case in cases:
        cap = case.get("max_total_num_tokens")
        change = "–"
        if cap and base_cap and case.get("hicache"):
            change = f"{100 * (cap - base_cap) / base_cap:+.1f} %"
        thr = case.get("input_throughput")
        lines.append(
            f"| {md(case['name'], True)} | {_ms(case.get('median_ttft_ms'))} | "
            f"{'–' if thr is None else f'{float(thr):,.0f} tok/s'} | {_ms(case.get('median_e2e_latency_ms'))} | "
            f"{'–' if cap is None else f'{int(cap):,}'} | {change} |" + (f" {_cached(case)} |" if with_cache else "")
        )
    return "\n".join(lines) + "\n"


def ab_chart_data(cases: list[dict[str, Any]]) -> tuple[list[str], dict[str, list[float | None]]]:
    """Bars for the chart. Cases with a probe tier (cold/device/host): one group per tier, a
    baseline bar next to a HiCache bar, so each comparison sits side by side. Otherwise one bar
    per case."""
    if cases and all(c.get("tier") in AB_TIERS and isinstance(c.get("hicache"), bool) for c in cases):
        tiers = list(dict.fromkeys(c["tier"] for c in cases))
        series: dict[str, list[float | None]] = {}
        for hicache in (False, True):
            if any(c["hicache"] is hicache for c in cases):
                by_tier = {c["tier"]: c.get("median_ttft_ms") for c in cases if c["hicache"] is hicache}
                series[AB_SERIES[hicache]] = [by_tier.get(t) for t in tiers]
        return [AB_TIERS[t] for t in tiers], series
    return [case["name"] for case in cases], {"TTFT": [case.get("median_ttft_ms") for case in cases]}


def cmd_ab(record_path: Path) -> int:
    record = json.loads(record_path.read_text())
    md_path = record_path.with_suffix(".md")
    md_path.write_text(ab_markdown(record))
    cases = record.get("cases", [])
    base_cap, on_cap, change = _capacity_change(cases)
    title = f"HiCache A/B on {record.get('host', '?')}: time to first token (shorter is better)"
    if change is not None:
        title += f"\nprice: GPU KV capacity {base_cap:,} → {on_cap:,} tokens ({100 * change:+.1f} %)"
    labels, series = ab_chart_data(cases)
    ttft_chart(record_path.with_suffix(".png"), title, labels, series, colours=AB_COLOURS)
    print(md_path.read_text(), end="")
    print(f"\nchart: {record_path.with_suffix('.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("rollout").add_argument("run_dir", type=Path)
    sub.add_parser("ab").add_argument("record", type=Path)
    args = parser.parse_args(argv)
    if args.command == "rollout":
        return cmd_rollout(args.run_dir)
    return cmd_ab(args.record)


if __name__ == "__main__":
    sys.exit(main())
