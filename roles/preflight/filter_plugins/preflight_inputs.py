"""Filters of the preflight role: the rollout's inputs' type, range and charset, before any host changes.

Issue 24 ("No way in"). A value that reaches a report path, a URL or an HTTP header is checked here,
on the controller (the sglang_service inputs by that role's own checks), with full-string matches
(``re.fullmatch``; never ``$``, which accepts a trailing newline). Each finding names the variable
and the fix and never echoes a key.

- ``preflight_models_plan_findings(result, action)``: the findings of a models plan that failed (each
  problem it names: a manifest path, a link out of sync_src, a manifest file that cannot be read).
- ``preflight_run_input_findings(inputs)``: the rollout gate's thresholds and booleans, preflight's
  own knobs, the inventory host name (it becomes a report path), the ROCm key URL, the router key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f]")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0", "y", "n", "t", "f"}


# Gate thresholds: (min, max, min exclusive, integer). Outside them a gate passes everything, fails
# everything or runs for hours after the restart.
PROBE_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "rollout_probe_input_len_canary": (1, 2_000_000, False, True),
    "rollout_probe_input_len": (1, 2_000_000, False, True),
    "rollout_probe_cold_output_len": (1, 32768, False, True),
    "rollout_probe_warm_output_len": (1, 32768, False, True),
    "rollout_probe_repeats": (1, 20, False, True),
    "rollout_probe_ready_timeout": (1, 86400, False, True),
    "rollout_probe_flush_timeout": (1, 3600, False, True),
    "rollout_probe_request_timeout": (1, 86400, False, True),
    "rollout_probe_max_warm_cold_ratio": (0, 1, True, False),
    "rollout_probe_min_cached_fraction": (0, 1, False, False),
    "rollout_probe_min_host_cached_fraction": (0, 1, False, False),
    "rollout_probe_max_regression": (0, 100, False, False),
    "rollout_probe_regression_slack_ms": (0, 600000, False, False),
    "rollout_probe_max_warm_ttft_s": (0, 3600, True, False),
    "rollout_probe_seed": (0, 2**31 - 1, False, True),
    "rollout_probe_parity_tokens": (0, 4096, False, True),
    "rollout_probe_parity_logprob_tolerance": (0, 100, False, False),
}
# preflight's own knobs: a value outside these switches a check off instead of setting it.
KNOB_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "preflight_expected_gpus": (0, 64, False, True),
    "preflight_rocm_disk_gb": (0, 100000, False, False),
    "preflight_rocm_debs_disk_gb": (0, 100000, False, False),
    "preflight_venv_disk_gb": (0, 100000, False, False),
    "preflight_models_disk_gb": (0, 100000, False, False),
    # The probe-pool rule's figures (0: the rule is off; a negative one would switch it off unsaid).
    "preflight_probe_device_tokens": (0, 10**9, False, True),
    "preflight_kv_bytes_per_token": (0, 10**9, False, True),
    "preflight_mamba_device_bytes": (0, 10**15, False, True),
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(float(value)) else None
    text = str(value)
    if re.fullmatch(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", text):
        return float(text)
    return None


def _range_finding(name: str, value: Any, rule: tuple[float, float, bool, bool]) -> str | None:
    low, high, low_open, integer = rule
    number = _number(value)
    kind = "a whole number" if integer else "a number"
    if number is None or (integer and not number.is_integer()):
        return f"{name} = {value!r} is not {kind}; set it to {kind} in {'(' if low_open else '['}{low:g}, {high:g}]."
    if (number <= low if low_open else number < low) or number > high:
        return (
            f"{name} = {value!r} is out of range; it must be {'>' if low_open else '>='} {low:g} and <= {high:g} "
            "(see the role's defaults for what it means)."
        )
    return None


def secret_findings(secrets: Mapping[str, Any]) -> list[str]:
    """Keys with whitespace or control characters (never shown): they break the header or the YAML."""
    found = []
    for variable, value in secrets.items():
        if value is None or value == "":
            continue
        if not isinstance(value, str) or _SPACE_OR_CONTROL.search(value):
            found.append(
                f"{variable} contains whitespace or a control character (the value is not shown); a key is one "
                "word. `echo key | ansible-vault encrypt_string` keeps echo's newline: use `printf %s key | "
                "ansible-vault encrypt_string --stdin-name ...` instead."
            )
    return found


def _bool_findings(name: str, value: Any) -> list[str]:
    if isinstance(value, bool) or value is None:
        return []
    if str(value).strip().lower() in _BOOL_WORDS:
        return []
    return [f"{name} = {value!r} is not a boolean; use true or false."]


def run_input_findings(inputs: Mapping[str, Any]) -> list[str]:
    """The gate's thresholds and booleans, preflight's knobs, the host name, the ROCm key URL, the router key.

    inputs: probe ({variable: value}), booleans ({variable: value}), knobs ({variable: value}),
    host (inventory_hostname), rocm_key_url (or rocm_repo_base_url, from
    which the rocm role derives it), router_url (rollout_router_url), secrets.
    """
    found: list[str] = []
    for name, value in (inputs.get("probe") or {}).items():
        rule = PROBE_RANGES.get(name)
        if rule is None or (name == "rollout_probe_max_warm_ttft_s" and value in (None, "", "None")):
            continue
        error = _range_finding(name, value, rule)
        if error:
            found.append(error)
    for name, value in (inputs.get("booleans") or {}).items():
        found += _bool_findings(name, value)
    for name, value in (inputs.get("knobs") or {}).items():
        error = _range_finding(name, value, KNOB_RANGES[name]) if name in KNOB_RANGES else None
        if error:
            found.append(error + " preflight's own settings cannot switch its checks off.")
    host = inputs.get("host")
    if host is not None and not _HOST.fullmatch(str(host)):
        found.append(
            f"the inventory host name {host!r} is not safe in a file name (it names the host's report files); use "
            "letters, digits, '.', '_' and '-', starting with a letter or digit, and set ansible_host for the address."
        )
    url = inputs.get("rocm_key_url")
    base = inputs.get("rocm_repo_base_url")
    if url in (None, "", "None") and base not in (None, "", "None"):
        url = f"{base}/rocm/rocm.gpg.key"  # the rocm role's default, from the inventory's base URL
    https = isinstance(url, str) and re.fullmatch(r"https://[^\s\x00-\x1f\x7f]+", url)
    if url not in (None, "", "None") and not https:
        shown = re.sub(r"://[^/@]*@", "://", str(url))  # a mirror's user:password is not repeated
        found.append(
            f"rocm_amd_key_url = {shown!r} is not an https:// URL; the key that signs every ROCm package must come "
            "over TLS (set rocm_amd_key_url or rocm_amd_repo_base_url to https://...)."
        )
    found += _router_url_findings(inputs.get("router_url"))
    found += secret_findings(inputs.get("secrets") or {})
    return found


def _router_url_findings(url: Any) -> list[str]:
    """rollout_router_url: "" (no router) or http(s)://HOST:PORT, without user:password@ (the router's key is
    rollout_router_api_key, sent as a header by no_log tasks; a URL is printed, logged and reported)."""
    if url in (None, "", "None"):
        return []
    text = str(url)
    shown = re.sub(r"://[^/@]*@", "://", text)  # user:password is not repeated
    if re.fullmatch(r"https?://[^/@\s\x00-\x1f\x7f]+@[^/\s\x00-\x1f\x7f]+/?", text):
        return [
            f"rollout_router_url = {shown!r} carries a user:password@; a URL is printed and written into reports, so "
            "leave credentials out of it and put the router's key in rollout_router_api_key (vault)."
        ]
    if not re.fullmatch(r"https?://[^/@\s\x00-\x1f\x7f]+/?", text):
        return [
            f"rollout_router_url = {shown!r} is not a router base URL; set it to http://HOST:PORT (the sglang-router's "
            'address), or to "" for no router.'
        ]
    return []


def models_plan_findings(result: Any, action: Any = "") -> list[str]:
    """Findings of the models plan (roles/models, entry point check): its ``models_plan_problems`` (a
    list, each naming its variable), or, for a plan that failed, its argument specs' errors or message."""
    if isinstance(result, list):
        return [f"{' '.join(str(problem).split())} (roles/models)" for problem in result]
    if action == "ansible.builtin.validate_argument_spec":
        errors = "; ".join(str(e) for e in result.get("argument_errors") or [])
        return [f"the models were not planned: their variables fail the argument specs of the models role ({errors}); "
                "fix them in the inventory first."]
    message = " ".join(str(result.get("msg") or "the models plan failed").split())[:600]
    return [f"the models could not be planned ({message}); fix models_main / models_draft first."]


class FilterModule:
    """Jinja filters of the preflight role: the inputs' type, range and charset."""

    def filters(self) -> dict[str, Any]:
        return {
            "preflight_run_input_findings": run_input_findings,
            "preflight_models_plan_findings": models_plan_findings,
        }
