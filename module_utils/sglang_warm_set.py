# hicache-fleet: warm a host before it rejoins the router (issue 27 item 3): each prompt of the
# operator's warm set is sent once through the native /generate API.
# Plain functions, unit-tested in tests/probe; the module library/sglang_warm_set.py uses them.
# Runs on the managed host with its system Python: standard library and ansible.module_utils only.

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable

from ansible.module_utils.sglang_probe_client import ProbeError, SGLangClient, safe_text

ARGUMENT_SPEC = {
    "url": {"type": "str", "default": "http://127.0.0.1:30000"},
    "api_key": {"type": "str", "no_log": True},
    "files": {"type": "list", "elements": "path", "required": True},
    "max_new_tokens": {"type": "int", "default": 1, "no_log": False},  # a count of output tokens, no secret
    "request_timeout": {"type": "float", "default": 900.0},
    "total_timeout": {"type": "float", "default": 3600.0},
}

MAX_FILE_BYTES = 64 * 1024 * 1024


def validate_params(p: dict) -> list[str]:
    """Every bad option, one sentence each, naming it."""
    errors = []
    if not p.get("files"):
        errors.append("files must name at least one file (a text prompt, or a .json list of token ids).")
    if p.get("max_new_tokens") is None or p["max_new_tokens"] < 1:
        errors.append(f"max_new_tokens must be at least 1 (got {p.get('max_new_tokens')}).")
    for name in ("request_timeout", "total_timeout"):
        value = p.get(name)
        if value is None or not (value > 0 and math.isfinite(value)):
            errors.append(f"{name} must be a number of seconds greater than 0 (got {value}).")
    return errors


def load_prompt(path: str) -> dict:
    """One warm-set file as the /generate prompt: {"text": ...} or {"input_ids": [...]}, or a
    ProbeError naming files and the path. A .json file holds a list of token ids or {"input_ids": [...]};
    any other file is the prompt text (UTF-8)."""
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise ProbeError(f"files: {path} has {size} bytes, more than {MAX_FILE_BYTES}; a warm prompt is "
                             "a prompt, not a corpus.")
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ProbeError(f"files: cannot read {path} ({exc.strerror or exc}); name files that exist on the "
                         "host (copy them there first).") from exc
    if path.endswith(".json"):
        try:
            value = json.loads(data)
        except ValueError as exc:
            raise ProbeError(f"files: {path} is not valid JSON ({exc}); a .json warm file holds a list of "
                             "token ids or {\"input_ids\": [...]}.") from exc
        ids = value.get("input_ids") if isinstance(value, dict) else value
        if (not isinstance(ids, list) or not ids
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
            raise ProbeError(f"files: {path} holds no token ids: a .json warm file holds a non-empty list of "
                             "whole numbers >= 0, or {\"input_ids\": [...]} (a text prompt goes in a file not "
                             "named .json).")
        return {"input_ids": ids}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProbeError(f"files: {path} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from exc
    if not text.strip():
        raise ProbeError(f"files: {path} is empty; a warm prompt needs text.")
    return {"text": text}


def load_prompts(files: list[str]) -> list[tuple[str, dict]]:
    """Every file, read and checked before anything is sent."""
    return [(path, load_prompt(path)) for path in files]


def warm_body(prompt: dict, max_new_tokens: int) -> bytes:
    payload = dict(prompt)
    payload.update(sampling_params={"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
                   stream=True)
    return json.dumps(payload, separators=(",", ":")).encode()


def warm_plan(prompts: list[tuple[str, dict]], p: dict) -> list[dict]:
    return [{"file": path, "kind": "input_ids" if "input_ids" in prompt else "text",
             "input_ids": len(prompt["input_ids"]) if "input_ids" in prompt else None,
             "chars": len(prompt["text"]) if "text" in prompt else None,
             "request": f"POST {p['url'].rstrip('/')}/generate -> {p['max_new_tokens']} tokens"}
            for path, prompt in prompts]


def send_warm_set(p: dict, prompts: list[tuple[str, dict]],
                  clock: Callable[[], float] = time.monotonic) -> dict:
    """Send each prompt once; never raises on a request error: each file says ok or its error, and the
    totals count the warm tokens (prompt tokens of the sends that succeeded)."""
    start = clock()
    files = []
    warnings = []
    for path, prompt in prompts:
        entry: dict = {"file": path, "ok": False, "error": None, "tokens": None, "cached_tokens": None,
                       "device_cached_tokens": None, "host_cached_tokens": None, "storage_cached_tokens": None,
                       "ttft_ms": None}
        remaining = p["total_timeout"] - (clock() - start)
        if remaining <= 0:
            entry["error"] = f"not sent: total_timeout {p['total_timeout']:g} s ran out"
            files.append(entry)
            warnings.append(f"warm file {path}: {entry['error']}")
            continue
        client = SGLangClient(p["url"], p.get("api_key"), min(p["request_timeout"], remaining))
        try:
            run = client.stream_generate(warm_body(prompt, p["max_new_tokens"]), need_accounting=False)
        except ProbeError as exc:
            entry["error"] = safe_text(str(exc), 400)
            warnings.append(f"warm file {path} was not warmed: {entry['error']}")
        else:
            entry.update(ok=True, tokens=run.get("prompt_tokens") or len(prompt.get("input_ids") or []) or None,
                         cached_tokens=run["cached_tokens"], device_cached_tokens=run["device_cached_tokens"],
                         host_cached_tokens=run["host_cached_tokens"],
                         storage_cached_tokens=run["storage_cached_tokens"],
                         ttft_ms=round(run["ttft_s"] * 1000.0, 3))
        files.append(entry)
    ok = [f for f in files if f["ok"]]
    return {
        "files": files,
        "sent": sum(1 for f in files if f["ok"] or not f["error"].startswith("not sent")),
        "ok": len(ok),
        "failed_files": [f["file"] for f in files if not f["ok"]],
        "warm_tokens": sum(f["tokens"] or 0 for f in ok),
        "cached_tokens": sum(f["cached_tokens"] or 0 for f in ok),
        "seconds": round(clock() - start, 3),
        "warnings": warnings,
    }


def warm_summary(result: dict) -> str:
    line = (f"warmed {result['ok']} of {len(result['files'])} files: {result['warm_tokens']} tokens "
            f"({result['cached_tokens']} already cached) in {result['seconds']:g} s")
    if result["failed_files"]:
        line += f"; not warmed: {', '.join(result['failed_files'])} (see warnings; the host is not failed)"
    return line
