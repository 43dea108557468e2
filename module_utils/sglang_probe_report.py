# hicache-fleet: the records of the cold/warm TTFT probe: report JSON, summary, progress.
# Plain functions, unit-tested in tests/probe; the module library/sglang_cache_probe.py uses them.
# Runs on the managed host with its system Python: standard library and ansible.module_utils only.

from __future__ import annotations

import datetime
import json
import os

from ansible.module_utils.sglang_probe_capacity import capacity_line
from ansible.module_utils.sglang_probe_client import ProbeError
from ansible.module_utils.sglang_probe_measure import restart_line


def build_report(result: dict, p: dict) -> dict:
    """The JSON record written to report_path, in SGLang benchmark key names."""
    settings = {k: p.get(k) for k in (
        "url", "input_len", "cold_output_len", "warm_output_len", "seed", "repeats", "temperature",
        "tier", "filler_factor", "max_warm_ttft_s", "max_warm_cold_ratio", "min_cached_fraction",
        "min_host_cached_fraction", "min_storage_cached_fraction", "storage_write_wait_s", "storage_reread_first",
        "min_restart_storage_fraction", "max_regression", "regression_slack_ms", "gate", "parity_tokens",
        "parity_logprob_tolerance", "capacity_max_prefixes", "capacity_timeout_s")}
    return {
        "tool": "sglang_cache_probe",
        "backend": "sglang",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "dataset_name": "random-ids-repeated-block",
        "random_input_len": p["input_len"],
        "seed": p["seed"],
        "max_concurrency": 1,
        "settings": settings,
        "server_info": result.get("server"),
        "cold": result.get("cold"),
        "warm": result.get("warm"),
        "fillers": result.get("fillers"),
        "gate": result.get("gate"),
        "parity": result.get("parity"),
        "pools": result.get("pools"),
        "capacity": result.get("capacity"),
        "storage": result.get("storage"),
        "restart_hit": result.get("restart_hit"),
    }


def parity_line(parity: dict | None) -> str | None:
    """Answer parity in one line, e.g. `parity: 8 tokens equal (device tier, host tier)`; None when
    the probe did not get that far. Only numbers and fixed words: nothing the server sent as text."""
    if not isinstance(parity, dict):
        return None
    if not parity.get("enabled"):
        return "parity: off (parity_tokens 0: the answers were not compared)"
    tiers = parity.get("tiers") or {}
    tokens = int(parity.get("tokens") or 0)
    parts = []
    for status in ("diverged", "not_checkable", "equal"):
        names = [t for t, s in tiers.items() if s.get("status") == status]
        if not names:
            continue
        named = ", ".join(f"{t} tier" for t in names)
        if status == "equal":
            only = [t for t in names if not tiers[t].get("logprobs_compared")]
            note = "; ids only, the server returned no logprobs" if only else ""
            parts.append(f"{tokens} tokens equal ({named}{note})")
        elif status == "not_checkable":
            parts.append(f"not checkable ({named})")
        else:
            where = ", ".join(f"{t} tier at token {int(tiers[t]['position'])} ({tiers[t].get('cause')})"
                              for t in names)
            parts.append(f"DIFFERS ({where})")
    return "parity: " + ("; ".join(parts) if parts else "no warm read compared")


def summary_line(result: dict) -> str:
    parts = []
    cold = result.get("cold") or {}
    if cold.get("median_ttft_ms") is not None:
        parts.append(f"cold TTFT {cold['median_ttft_ms']:.1f} ms")
    for tier, case in (result.get("warm") or {}).items():
        if case.get("median_ttft_ms") is not None:
            parts.append(f"warm {tier} TTFT {case['median_ttft_ms']:.1f} ms "
                         f"(ratio {case.get('warm_cold_ratio')}, cached {case.get('median_cached_tokens')}, "
                         f"host {case.get('median_host_cached_tokens')}"
                         + (f", storage {case.get('median_storage_cached_tokens')}" if tier == "storage" else "")
                         + ")")
    line = restart_line(result.get("restart_hit"))
    if line:
        parts.append("restart re-read " + line)
    storage = result.get("storage") or {}
    if storage.get("note"):
        parts.append("storage tier not measured (no storage backend)")
    line = parity_line(result.get("parity"))
    if line:
        parts.append(line)
    line = capacity_line(result.get("capacity"))
    if line:
        parts.append(line)
    gate = result.get("gate") or {}
    if gate:
        verdict = "passed" if gate.get("passed") else "FAILED: " + "; ".join(gate.get("reasons", []))
        parts.append(("gate " if gate.get("enabled") else "checks (gate off) ") + verdict)
    return "; ".join(parts)


def write_report(path: str, report: dict) -> None:
    try:
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, sort_keys=False)
            fh.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise ProbeError(f"cannot write report_path {path}: {exc.strerror or exc}; choose a writable path.") from exc


def _seconds_or_ms(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1000:.3g} ms"


def round_line(number: int, total: int, runs: dict) -> str:
    """One round's figures on one line, as the progress file and the playbooks print them."""
    cold = runs.get("cold") or {}
    parts = [f"round {number}/{total}:"]
    if cold:
        parts.append(f"cold TTFT {_seconds_or_ms(cold['ttft_s'])} (cached {cold['cached_tokens']})")
    for tier in ("device", "host", "storage"):
        run = runs.get(tier)
        if not run:
            continue
        ratio = f", {run['ttft_s'] / cold['ttft_s']:.4f} of cold" if cold.get("ttft_s") else ""
        host = f", from host {run['host_cached_tokens']}" if tier == "host" else ""
        if tier == "storage":
            host = f", from storage {run.get('storage_cached_tokens') or 0}"
        parts.append(f"warm {tier} TTFT {_seconds_or_ms(run['ttft_s'])}{ratio} (cached {run['cached_tokens']}{host})")
    return " ".join(parts[:2]) + "".join(f"; {p}" for p in parts[2:])


PROGRESS_MODE = 0o600


class ProgressLog:
    """Lines appended to a file while the probe runs (none without a path): `start: ...`, one
    `round N/M: ...` per round, and `end: ...`. The file is started afresh by each probe, mode 0600
    (an older one's mode too): it names the server and its errors, for root's eyes only."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        if path:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PROGRESS_MODE)
                try:
                    os.fchmod(fd, PROGRESS_MODE)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise ProbeError(f"cannot write progress_path {path}: {exc.strerror or exc}; choose a writable "
                                 "path.") from exc

    def write(self, line: str) -> None:
        if not self.path:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line.replace("\n", " ") + "\n")
        except OSError:  # progress is for people watching; the probe's result does not depend on it
            pass

    def on_round(self, number: int, total: int, runs: dict) -> None:
        self.write(round_line(number, total, runs))
