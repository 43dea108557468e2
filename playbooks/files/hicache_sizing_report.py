#!/usr/bin/env python3
"""The HiCache sizing sweep's report (issue 26), on the controller: hicache_sizing_report.py <sweep_dir>.

Reads <sweep_dir>/plan.json and <sweep_dir>/results/*.json (module_utils/sglang_sizing.py describes both)
and writes, 0644, into <sweep_dir>: report.md (what, where, when; every candidate with its status and
reason; the recommendation and why), chart.png (prefixes held against warm host TTFT, point size = RAM
pinned; GPU KV tokens per candidate), recommendation.json, and group_vars/<class>.yml when a candidate
is recommended. Prints the table. Exits 2 with a message naming the file on a bad input.
matplotlib is pinned in requirements/controller.txt.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _load_sizing() -> Any:
    """module_utils/sglang_sizing.py by its path; its own import of sglang_pool_plan resolves through
    ansible.module_utils, to which the checkout's module_utils/ is added (as ansible.cfg does)."""
    import ansible.module_utils

    if str(REPO / "module_utils") not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(str(REPO / "module_utils"))
    spec = importlib.util.spec_from_file_location("hicache_sglang_sizing", REPO / "module_utils" / "sglang_sizing.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sizing = _load_sizing()


class ReportError(Exception):
    """A bad input: the message names the file and what is wrong."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc})") from exc


def load_sweep(sweep: Path) -> tuple[dict, list[dict], list[str]]:
    """(plan, rows, notes): one row per candidate of the plan, its result when one of this release exists."""
    if not sweep.is_dir():
        raise ReportError(f"{sweep}: no such sweep directory (the sweep playbook writes it)")
    plan = _read_json(sweep / "plan.json")
    if not isinstance(plan, dict):
        raise ReportError(f"{sweep / 'plan.json'}: not a JSON object")
    for key in ("host", "release_id", "facts", "needs", "candidates"):
        if key not in plan:
            raise ReportError(f"{sweep / 'plan.json'}: the key {key!r} is missing")
    cands = plan["candidates"]
    if not isinstance(cands, list) or not all(isinstance(c, dict) and "id" in c for c in cands):
        raise ReportError(f"{sweep / 'plan.json'}: candidates must be a list of objects with an id")
    notes: list[str] = []
    done, _todo = sizing.resume_state(str(sweep / "results"), plan, notes)
    rows = []
    for cand in plan["candidates"]:
        cid = cand["id"]
        if cid in done:
            path = sweep / "results" / f"{cid}.json"
            res = _read_json(path) if path.is_file() else None
            if res is None:  # the result file is named otherwise: find it again
                for path in sorted((sweep / "results").glob("*.json")):
                    data = _read_json(path)
                    same = isinstance(data, dict) and data.get("release_id") == plan["release_id"]
                    if same and data.get("id") == cid:
                        res = data
                        break
            rows.append({**cand, **(res or {})})
        elif cand.get("status") == "pruned":
            rows.append({**cand, "status": "pruned", "error": cand.get("reason", "")})
        else:
            rows.append({**cand, "status": "not_run", "error": "not run (sweep interrupted or stopped by its bound)"})
    return plan, rows, notes


def _fmt_ms(value: Any) -> str:
    return "" if not isinstance(value, (int, float)) or isinstance(value, bool) else f"{value * 1000:.0f}"


def _fmt_int(value: Any) -> str:
    return "" if not isinstance(value, int) or isinstance(value, bool) else f"{value:,}"


def _fmt_gb(value: Any) -> str:
    return "" if not isinstance(value, (int, float)) or isinstance(value, bool) else f"{value / 1e9:.1f}"


def table(rows: list[dict], recommendation: dict) -> list[list[str]]:
    head = ["candidate", "status", "start s", "GPU KV tokens", "host KV tokens", "pinned GB", "RAM left GB",
            "cold ms", "warm dev ms", "warm host ms", "parity", "prefixes held", "why"]
    out = [head]
    for row in rows:
        held = row.get("prefixes_held")
        held_txt = "" if not isinstance(held, int) else str(held)
        if held_txt and row.get("prefixes_bound_reached"):
            held_txt = f">= {held}"
        parity = row.get("parity_ok")
        why = recommendation["reasons"].get(row["id"]) or row.get("error") or row.get("reason") or ""
        out.append([
            row["id"], str(row.get("status")),
            "" if not isinstance(row.get("start_s"), (int, float)) else f"{row['start_s']:.0f}",
            _fmt_int(row.get("device_tokens")), _fmt_int(row.get("host_tokens")),
            _fmt_gb(row.get("pinned_bytes", row.get("host_pool_bytes"))), _fmt_gb(row.get("ram_left_bytes")),
            _fmt_ms(row.get("cold_ttft_s")), _fmt_ms(row.get("warm_device_ttft_s")),
            _fmt_ms(row.get("warm_host_ttft_s")),
            "" if parity is None else ("ok" if parity else "FAILED"), held_txt, why,
        ])
    return out


def markdown_table(cells: list[list[str]]) -> str:
    def esc(text: str) -> str:
        return " ".join(str(text).split()).replace("|", "\\|")

    lines = ["| " + " | ".join(esc(c) for c in cells[0]) + " |", "|" + "---|" * len(cells[0])]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in cells[1:]]
    return "\n".join(lines)


def text_table(cells: list[list[str]]) -> str:
    short = [row[:-1] for row in cells]  # the reasons are in report.md
    widths = [max(len(row[i]) for row in short) for i in range(len(short[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in short)


def render_chart(rows: list[dict], choice: str | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    measured = [r for r in rows if r.get("status") == "ok" and isinstance(r.get("warm_host_ttft_s"), (int, float))]
    for row in measured:
        pinned = float(row.get("pinned_bytes") or row.get("host_pool_bytes") or 0) / 1e9
        colour = "#c0504d" if row["id"] == choice else "#4f81bd"
        point = (row["warm_host_ttft_s"] * 1000, int(row.get("prefixes_held") or 0))
        left.scatter(*point, s=30 + pinned * 6, color=colour, alpha=0.7, edgecolors="black")
        left.annotate(f"{row['id']} ({pinned:.0f} GB)", point, textcoords="offset points", xytext=(5, 5), fontsize=8)
    left.yaxis.get_major_locator().set_params(integer=True)
    left.set_xlabel("warm TTFT from the host tier (ms)")
    left.set_ylabel("reusable prefixes held in host RAM")
    left.set_title("prefixes held vs warm host TTFT (size = RAM pinned)")
    if not measured:
        left.text(0.5, 0.5, "no candidate measured", ha="center", va="center", transform=left.transAxes)
    ids = [r["id"] for r in rows]
    tokens = [r.get("device_tokens") if isinstance(r.get("device_tokens"), int) else 0 for r in rows]
    colours = ["#c0504d" if r["id"] == choice else ("#4f81bd" if r.get("status") == "ok" else "#bbbbbb") for r in rows]
    right.bar(range(len(ids)), tokens, color=colours)
    right.set_xticks(range(len(ids)), ids, rotation=60, ha="right", fontsize=8)
    right.set_ylabel("GPU KV tokens per rank")
    right.set_title("GPU KV capacity per candidate (grey: not measured ok)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _write(path: Path, data: str | bytes | None = None) -> None:
    if data is not None:
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
    os.chmod(path, 0o644)


def build(sweep: Path) -> dict:
    plan, rows, notes = load_sweep(sweep)
    try:
        class_name = sizing.host_class(plan["facts"])
        results = [r for r in rows if r.get("status") not in ("pruned", "not_run")]
        recommendation = sizing.recommend(results, plan["needs"])
    except sizing.SizingError as exc:
        raise ReportError(f"{sweep / 'plan.json'}: {exc}") from exc
    for row in rows:
        if row["id"] not in recommendation["reasons"]:
            recommendation["reasons"][row["id"]] = f"{row['status']}: {row.get('error') or row.get('reason') or ''}"
    recommendation["class"] = class_name
    recommendation["host"] = plan["host"]
    recommendation["release_id"] = plan["release_id"]
    recommendation["ignored_results"] = notes
    cells = table(rows, recommendation)
    choice = recommendation["choice"]
    group_vars_rel = f"group_vars/{class_name}.yml"
    if choice:
        chosen = next(r for r in rows if r["id"] == choice)
        evidence = {
            "host": plan["host"], "date": plan.get("started", ""), "release_id": plan["release_id"],
            "sglang_version": plan.get("sglang_version", ""), "report_path": str(sweep / "report.md"),
            "fleet": plan.get("fleet"), "reason": recommendation["reasons"][choice],
        }
        text = sizing.group_vars_text(chosen, plan.get("hicache_args_now") or {}, class_name, evidence)
        (sweep / "group_vars").mkdir(exist_ok=True)
        os.chmod(sweep / "group_vars", 0o755)  # noqa: S103 - a report directory the operator reads
        _write(sweep / group_vars_rel, text)
        recommendation["group_vars"] = group_vars_rel
    elif (sweep / group_vars_rel).exists():
        (sweep / group_vars_rel).unlink()  # an earlier report's choice must not be committed by mistake
    needs = plan["needs"]
    lines = [
        f"# HiCache sizing: {plan['host']} (class {class_name})",
        "",
        f"- host: {plan['host']}, fleet {plan.get('fleet') or 'n/a'}; started {plan.get('started', 'n/a')}",
        f"- release {plan['release_id']}, SGLang {plan.get('sglang_version', 'n/a')}",
        f"- facts: {json.dumps(plan['facts'], sort_keys=True)}",
        f"- needs: at least {needs.get('min_device_tokens')} GPU KV tokens, warm host TTFT within "
        f"{float(needs.get('warm_margin', 0)):.0%} + {float(needs.get('warm_slack_s', 0)) * 1000:g} ms of the best, "
        f"{float(needs.get('reserve_bytes', 0)) / 1e9:g} GB of RAM left (sglang_service_memory_reserve_gb)",
        f"- candidates: {len(rows)} ({sum(r['status'] == 'pruned' for r in rows)} pruned before any start, "
        f"{sum(r['status'] == 'not_run' for r in rows)} not run)",
        "",
        "## Recommendation",
        "",
    ]
    if choice:
        lines += [
            f"**{choice}**: {recommendation['reasons'][choice]}.",
            "",
            f"`{group_vars_rel}` (beside this report) sets it for the class: commit it as "
            f"`inventories/{plan.get('fleet') or '<fleet>'}/group_vars/{class_name}.yml` and roll it out "
            "through the gate.",
        ]
    else:
        lines.append(
            "**No candidate is admissible**; each candidate's reason is in the table. No group_vars file written."
        )
    lines += ["", "## Candidates", "", markdown_table(cells), "", "![chart](chart.png)", ""]
    if notes:
        lines += ["## Results ignored", ""] + [f"- {n}" for n in notes] + [""]
    _write(sweep / "report.md", "\n".join(lines))
    render_chart(rows, choice, sweep / "chart.png")
    _write(sweep / "chart.png")
    _write(sweep / "recommendation.json", json.dumps(recommendation, indent=2, sort_keys=True) + "\n")
    print(text_table(cells))
    print(f"recommendation: {choice or 'none admissible'} -> {sweep / 'report.md'}")
    return recommendation


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: hicache_sizing_report.py <sweep_dir>", file=sys.stderr)
        return 2
    try:
        build(Path(argv[1]))
    except ReportError as exc:
        print(f"hicache_sizing_report: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
