# hicache-fleet: the pool arithmetic of SGLang 0.5.23 as the plan expects it (issue 25, items 2 and 3).
# Plain functions, unit-tested in tests/probe/test_pool_plan.py.
# Runs on the managed host with its system Python or on the controller: standard library only.
"""The pool arithmetic of SGLang 0.5.23, as the plan expects it (issue 25, items 2 and 3). Pure.

Read off the pinned wheel (sglang 0.5.23, site-packages/sglang/srt/):

* KV heads per rank: ``configs/model_config.py`` ``ModelConfig.get_num_kv_heads``:
  ``max(1, total_num_kv_heads // tp_size)``.
* KV bytes per token per rank (MHA): ``mem_cache/pool_host/mha.py`` ``MHATokenToKVPoolHost.get_size_per_token``:
  ``(head_dim + v_head_dim) * head_num * layer_num * dtype.itemsize``, where layer_num counts only the layers
  with a per-token KV: a hybrid (Mamba/GDN) model's linear-attention layers keep a per-request state in the
  Mamba pool instead.
* Host pool tokens: ``mem_cache/pool_host/base.py`` ``HostKVCache.__init__``: with ``host_size`` (GB,
  ``--hicache-size``) > 0, ``size = int(host_size * 1e9 // size_per_token)``, else
  ``size = int(device_capacity_tokens * host_to_device_ratio)``; then one padding page:
  ``page_num = size // page_size + 1``; ``size = page_num * page_size``.
* Hybrid models: ``mem_cache/hybrid_cache/hybrid_pool_assembler.py`` ``_split_hicache_size``: with
  ``--hicache-size``, the GB are split between the KV host pool and the Mamba host pool in proportion of their
  DEVICE pools' bytes (``host_size = hicache_size * kv_bytes / (kv_bytes + mamba_bytes)``). The Mamba device
  pool's bytes are not reported over HTTP (``/get_server_info`` ``internal_states[].memory_usage`` has
  ``kvcache`` GB and ``token_capacity`` only), so without them the KV share is only bounded from above.
  With ``--hicache-ratio`` the KV host pool is ``ratio x`` the KV device tokens, exactly.
* Where the server reports the figures: device tokens in ``/get_server_info`` ``max_total_num_tokens`` and
  ``internal_states[i].memory_usage.token_capacity`` (``managers/scheduler_components/memory_usage.py``
  ``build_memory_usage``); ``page_size`` top level; the host pool ONLY in ``/metrics``
  ``sglang:hicache_host_total_tokens`` (``observability/metrics_collector.py``, set by
  ``managers/scheduler_components/metrics_reporter.py``) and the startup log line "Allocating ... hierarchical
  KV host pool: N tokens" — not in ``/get_server_info``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

DTYPE_BYTES = {
    "float32": 4.0,
    "float": 4.0,
    "float16": 2.0,
    "half": 2.0,
    "bfloat16": 2.0,
    "bf16": 2.0,
    "fp8_e5m2": 1.0,
    "fp8_e4m3": 1.0,
    "mxfp8": 1.0,
    "nvfp4": 0.5,
    "fp4_mx_block16": 0.5,
}

# SGLang's default --hicache-ratio (arg_groups/fields: 2.0; 1.2 when buffer_only).
DEFAULT_RATIO = 2.0
BUFFER_ONLY_RATIO = 1.2


class PoolPlanError(ValueError):
    """The model config or the launch arguments do not allow the figure asked for."""


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(config)
    if isinstance(config.get("text_config"), Mapping):
        merged.update(config["text_config"])
    return merged


def full_attention_layers(config: Mapping[str, Any]) -> int:
    """Layers that carry a per-token KV (a hybrid model's linear-attention layers do not)."""
    text = text_config(config)
    layers = int(text.get("num_hidden_layers") or 0)
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        return sum(1 for t in layer_types if "full" in str(t) or t == "attention")
    if text.get("full_attention_interval"):
        return layers // int(text["full_attention_interval"])
    return layers


def is_hybrid(config: Mapping[str, Any]) -> bool:
    text = text_config(config)
    layers = int(text.get("num_hidden_layers") or 0)
    return 0 < full_attention_layers(config) < layers


def kv_elem_bytes(config: Mapping[str, Any], kv_cache_dtype: Any = "auto", dtype: Any = "auto") -> float:
    for name in (kv_cache_dtype, dtype):
        if name and str(name) != "auto":
            return DTYPE_BYTES.get(str(name), 2.0)
    text = text_config(config)
    return DTYPE_BYTES.get(str(text.get("torch_dtype") or text.get("dtype") or "bfloat16"), 2.0)


def kv_bytes_per_token(config: Mapping[str, Any], tp_size: int, elem_bytes: float | None = None) -> int:
    """KV bytes per token per rank (get_size_per_token of the MHA host pool, on one TP rank)."""
    text = text_config(config)
    heads = int(text.get("num_attention_heads") or 1)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    hidden = int(text.get("hidden_size") or 0)
    head_dim = int(text.get("head_dim") or (hidden // heads if hidden else 0))
    layers = full_attention_layers(config)
    if layers <= 0 or head_dim <= 0 or int(tp_size) < 1:
        raise PoolPlanError(
            "config.json gives no attention layers or head_dim (num_hidden_layers, head_dim/hidden_size), "
            "or tp_size < 1: the KV bytes per token cannot be computed"
        )
    per_rank = max(1, kv_heads // int(tp_size))
    elem = kv_elem_bytes(config) if elem_bytes is None else elem_bytes
    return int((head_dim + head_dim) * per_rank * layers * elem)


def host_tokens(
    kv_bpt: int,
    device_tokens: int,
    page_size: int = 1,
    hicache_size_gb: float = 0,
    hicache_ratio: float | None = None,
    host_memory_mode: str = "cache",
    kv_share: float = 1.0,
) -> int:
    """Host KV pool tokens per rank, as HostKVCache.__init__ sizes it (padding page included).

    kv_share: the KV pool's share of --hicache-size (_split_hicache_size; 1.0 for a dense model).
    """
    page = max(1, int(page_size or 1))
    if hicache_size_gb and float(hicache_size_gb) > 0:
        size = int(float(hicache_size_gb) * kv_share * 1e9 // kv_bpt)
    else:
        ratio = hicache_ratio
        if ratio is None:
            ratio = BUFFER_ONLY_RATIO if host_memory_mode == "buffer_only" else DEFAULT_RATIO
        size = int(int(device_tokens) * float(ratio))
    return (size // page + 1) * page


def kv_share(kv_device_bytes: float, other_device_bytes: float) -> float:
    """_split_hicache_size: the KV pool's share of --hicache-size."""
    total = float(kv_device_bytes) + float(other_device_bytes)
    return float(kv_device_bytes) / total if total > 0 else 1.0


# --- the Mamba device pool of a hybrid GDN model (qwen3_5 / qwen3_next), as 0.5.23 allocates it -------------
MAMBA_STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # configs/mamba_utils.py mamba2_state_dtype
MAMBA_CONV_DTYPE_BYTES = 2  # mamba2_state_dtype: SGLANG_MAMBA_CONV_DTYPE, default bfloat16 (env not visible here)
MAMBA_RATIO_WITH_RADIX = (2, 5)  # kv_cache_configurator.py _calculate_mamba_ratio: 3 (-1 skip-lock, +0..2 tracking)


def _whole_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number == float(value) else None


def mamba_device_bytes(
    config: Mapping[str, Any], server_args: Mapping[str, Any], device_tokens: int | None = None
) -> tuple[int, int, str] | None:
    """(lowest, highest, how) bytes per rank of the Mamba device pool that _split_hicache_size weighs
    (``MambaPool.get_kv_size_bytes`` = ``mamba_cache.mem_usage_bytes()``), or None where 0.5.23's figure
    cannot be worked out from config.json and the server args (then the caller keeps its bound).

    server_args: ServerArgs field names (``/get_server_info`` top level, or the simulator's parsed values).
    Read off sglang 0.5.23 (site-packages/sglang/srt/):

    * State shapes: ``configs/qwen3_5.py`` / ``configs/qwen3_next.py`` ``mamba2_cache_params`` ->
      ``configs/mamba_utils.py`` ``Mamba2StateShape.create``: n_groups = linear_num_key_heads (extended by
      ``extra_groups_for_head_shards`` when not divisible by TP); conv_dim = linear_value_head_dim x
      linear_num_value_heads + 2 x n_groups x linear_key_head_dim; conv state (conv_dim / tp, conv_kernel - 1);
      temporal state (linear_num_value_heads / tp, linear_value_head_dim, linear_key_head_dim). tp is
      ``linear_attn_tp_size()``, the attention TP: ``--tp-size`` without DP attention (with it: None).
    * Dtypes: ``mamba2_state_dtype``: temporal = ``--mamba-ssm-dtype`` (serving_hook.py sets
      SGLANG_MAMBA_SSM_DTYPE), else config.json ``mamba_ssm_dtype``, else float32; conv = bfloat16 (the
      SGLANG_MAMBA_CONV_DTYPE default; an override in the unit's environment is not seen here).
    * Slots: ``mem_cache/memory_pool.py`` ``MambaPool.__init__``: every state tensor has ``size + 1`` rows
      (one padding slot), size = ``--max-mamba-cache-size`` (``kv_cache_configurator.py``
      ``_build_hybrid_req_pool`` -> ``HybridReqToTokenPool(mamba_size=max_mamba_cache_size)``, divided by
      the attention-DP size: dp 1 assumed). The radix tracking / extra-buffer slots
      (``get_mamba_tracking_slots``) are taken out of these slots (``MambaSlotAllocator(size=mamba_size)``),
      they add none.
    * Speculative decoding (``speculative_num_draft_tokens`` D, the target verify's scratch, ``SpeculativeState``):
      ``intermediate_ssm`` (layers, spec + 1, D, *temporal) and ``intermediate_conv_window``
      (layers, spec + 1, D, *conv; counted by ``get_tensor_size_bytes`` at its logical shape even when the
      deduplicated strided view backs it), spec = ``mamba_spec_state_size`` = max_num_reqs
      (``resolve_max_num_reqs``: min(--max-running-requests, device tokens // 2, max_mamba_cache_size //
      ratio)), ratio from ``_calculate_mamba_ratio`` = 1 without radix cache, else 2..5 (env and
      strategy dependent: not visible here, so both ends are computed; for the seed config both give 3).
      Not modelled (None): ReplaySSM (``--enable-linear-replayssm[-spec]``), adaptive speculative widths,
      DP attention, a model without the GDN ``linear_*`` keys.
    """
    text = text_config(config)
    need = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim")
    dims = {key: _whole_or_none(text.get(key)) for key in need}
    slots_arg = _whole_or_none(server_args.get("max_mamba_cache_size"))
    tp = _whole_or_none(server_args.get("tp_size")) or 1
    if any(v is None or v < 1 for v in dims.values()) or slots_arg is None or slots_arg < 1:
        return None
    if (server_args.get("enable_dp_attention") or server_args.get("enable_linear_replayssm")
            or server_args.get("enable_linear_replayssm_spec") or server_args.get("speculative_adaptive")):
        return None
    layers = int(text.get("num_hidden_layers") or 0) - full_attention_layers(config)
    n_groups = dims["linear_num_key_heads"]
    if n_groups % tp:
        n_groups += tp - n_groups  # extra_groups_for_head_shards, literally
    value_dim = dims["linear_value_head_dim"] * dims["linear_num_value_heads"]
    conv_dim = value_dim + 2 * n_groups * dims["linear_key_head_dim"]
    if layers < 1 or conv_dim % tp or dims["linear_num_value_heads"] % tp:
        return None  # divide() in Mamba2StateShape.create asserts
    conv_elems = conv_dim // tp * (dims["linear_conv_kernel_dim"] - 1)
    temporal_elems = dims["linear_num_value_heads"] // tp * dims["linear_value_head_dim"] * dims["linear_key_head_dim"]
    ssm_name = server_args.get("mamba_ssm_dtype") or text.get("mamba_ssm_dtype") or "float32"
    ssm_bytes = MAMBA_STATE_DTYPE_BYTES.get(str(ssm_name), 4)
    per_slot = conv_elems * MAMBA_CONV_DTYPE_BYTES + temporal_elems * ssm_bytes
    base = layers * (slots_arg + 1) * per_slot
    how = (f"Mamba pool {layers} GDN layers x ({slots_arg} + 1) slots x {per_slot} B "
           f"(conv {conv_elems} x {MAMBA_CONV_DTYPE_BYTES} B + SSM {temporal_elems} x {ssm_bytes} B)")
    drafts = _whole_or_none(server_args.get("speculative_num_draft_tokens"))
    if not server_args.get("speculative_algorithm") or not drafts:
        return base, base, how
    reqs = _whole_or_none(server_args.get("max_running_requests")) or 10**9
    cap = int(device_tokens) // 2 if device_tokens else 10**9
    ratios = (1, 1) if server_args.get("disable_radix_cache") else MAMBA_RATIO_WITH_RADIX
    spec_low, spec_high = (min(reqs, cap, slots_arg // r) for r in (ratios[1], ratios[0]))
    if spec_low < 1:
        return None
    step = layers * drafts * per_slot
    spec_how = f"spec {spec_low}" if spec_low == spec_high else f"spec {spec_low}..{spec_high}"
    return (base + (spec_low + 1) * step, base + (spec_high + 1) * step,
            how + f" + verify scratch {layers} x ({spec_how} + 1) x {drafts} draft tokens x {per_slot} B")


def expected_host_range(
    config: Mapping[str, Any],
    tp_size: int,
    device_tokens: int,
    page_size: int = 1,
    hicache_size_gb: float = 0,
    hicache_ratio: float | None = None,
    host_memory_mode: str = "cache",
    mamba_device_bytes: float | tuple[float, float] | None = None,
    elem_bytes: float | None = None,
) -> tuple[int, int, str]:
    """(lowest, highest, how) host KV tokens per rank the plan allows.

    Exact (lowest == highest) for a dense model, for --hicache-ratio, and for a hybrid model whose Mamba
    device pool bytes are known (a number, or a (lowest, highest) pair from mamba_device_bytes); a hybrid
    model with --hicache-size and unknown Mamba bytes gets (1 page, all GB to KV): only the upper bound is
    known. The KV device bytes _split_hicache_size weighs are MHATokenToKVPool.get_kv_size_bytes: K and V
    buffers of (device tokens + page_size) rows (memory_pool.py: one padding page).
    """
    bpt = kv_bytes_per_token(config, tp_size, elem_bytes)
    page = max(1, int(page_size or 1))
    by_size = bool(hicache_size_gb and float(hicache_size_gb) > 0)
    if by_size:
        how = f"--hicache-size {hicache_size_gb:g} GB x 1e9 / {bpt} B per token per rank"
    else:
        ratio = hicache_ratio if hicache_ratio is not None else "default"
        how = f"--hicache-ratio {ratio} x {device_tokens} device tokens"
    full = host_tokens(bpt, device_tokens, page, hicache_size_gb, hicache_ratio, host_memory_mode)
    if not by_size or not is_hybrid(config):
        return full, full, how + " + 1 padding page"
    if mamba_device_bytes is None:
        return page, full, how + " split with the Mamba host pool (its share unknown: upper bound only)"
    mamba_low, mamba_high = (
        mamba_device_bytes if isinstance(mamba_device_bytes, tuple) else (mamba_device_bytes, mamba_device_bytes)
    )
    kv_bytes = (int(device_tokens) + page) * bpt
    share_low, share_high = kv_share(kv_bytes, mamba_high), kv_share(kv_bytes, mamba_low)
    low = host_tokens(bpt, device_tokens, page, hicache_size_gb, hicache_ratio, host_memory_mode, share_low)
    high = host_tokens(bpt, device_tokens, page, hicache_size_gb, hicache_ratio, host_memory_mode, share_high)
    shares = f"{share_low:.4f}" if low == high else f"{share_low:.4f}..{share_high:.4f}"
    return low, high, how + f" x KV share {shares} (vs the Mamba device pool) + 1 padding page"


def compare(name: str, reported: int | None, low: int, high: int, tolerance: float, how: str) -> list[str]:
    """Failures (empty: fine) naming both figures when reported lies outside [low, high] +- tolerance."""
    if reported is None:
        return []
    lo = math.floor(low * (1 - tolerance))
    hi = math.ceil(high * (1 + tolerance))
    if lo <= int(reported) <= hi:
        return []
    expected = f"{low}" if low == high else f"{low}..{high}"
    return [
        f"{name}: the server reports {int(reported)} tokens per rank, the plan expects {expected} "
        f"({how}; tolerance {tolerance:.0%})"
    ]


def probe_host_pool_findings(
    host_pool_tokens: int,
    device_tokens: int,
    filler_factor: float,
    probe_lengths: Mapping[str, int],
    where: str,
) -> list[str]:
    """Item 3: the host pool must hold the probed prefix plus the fillers the host-tier proof pushes
    through it (module_utils/sglang_probe_measure.py filler_lengths: ceil(device_tokens x filler_factor))."""
    filler = math.ceil(int(device_tokens) * float(filler_factor))
    found = []
    for variable, length in probe_lengths.items():
        if length is None:
            continue
        need = int(length) + filler
        if need > int(host_pool_tokens):
            found.append(
                f"{where}: the host pool holds {int(host_pool_tokens)} tokens per rank but the probe needs "
                f"{need} ({variable} {int(length)} + {filler} filler tokens = the probe's filler_factor "
                f"{float(filler_factor):g} x {int(device_tokens)} device tokens): raise --hicache-size / "
                f"--hicache-ratio in sglang_service_hicache_args or lower {variable}."
            )
    return found


# --- after start, before the probe (issue 25 item 2) ------------------------------------------------
HOST_METRIC = "sglang:hicache_host_total_tokens"
POOL_TOLERANCE = 0.02  # a host pool within 2 % of the plan's figure passes
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9  # arg_groups/fields/schedule.py mamba_full_memory_ratio fallback


def read_model_config(model_path: Any) -> dict | None:
    """config.json of the model directory on this host, or None when it cannot be read."""
    if not isinstance(model_path, str) or not os.path.isdir(model_path):
        return None
    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def host_tokens_from_metrics(text: Any) -> int | None:
    """The smallest sglang:hicache_host_total_tokens sample of a Prometheus text page (one per rank)."""
    if not isinstance(text, str):
        return None
    values = []
    for line in text.splitlines():
        if line.startswith(HOST_METRIC + "{") or line.startswith(HOST_METRIC + " "):
            try:
                values.append(int(float(line.rsplit(None, 1)[-1])))
            except ValueError:
                continue
    return min(values) if values else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def server_pools(
    server_info: Mapping[str, Any],
    facts: Mapping[str, Any],
    metrics_text: Any,
    config: Mapping[str, Any] | None,
    tolerance: float = POOL_TOLERANCE,
) -> dict:
    """The pools the server reports against the plan's figures from its own flags and config.json.

    Returns device_tokens, kvcache_gb, host_tokens (reported, or None) with host_source, the expected
    range and how it was worked out, failures (one sentence each, both figures named) and a note on
    what was not checked.
    """
    info = server_info if isinstance(server_info, Mapping) else {}
    states = info.get("internal_states")
    usage = {}
    if isinstance(states, list) and states and isinstance(states[0], Mapping):
        usage = states[0].get("memory_usage") if isinstance(states[0].get("memory_usage"), Mapping) else {}
    device = facts.get("max_total_num_tokens")
    out: dict[str, Any] = {
        "device_tokens": device,
        "kvcache_gb": _number(usage.get("kvcache")),
        "page_size": facts.get("page_size") or 1,
        "host_tokens": None,
        "host_source": None,
        "host_expected": None,
        "host_expected_how": None,
        "failures": [],
        "note": None,
    }
    if not facts.get("enable_hierarchical_cache"):
        out["note"] = "HiCache off: no host pool"
        return out
    host = host_tokens_from_metrics(metrics_text)
    source = f"/metrics {HOST_METRIC}"
    sim = info.get("sglang_sim") if isinstance(info.get("sglang_sim"), Mapping) else {}
    if host is None and isinstance(sim.get("host_pool_tokens"), int):
        host, source = int(sim["host_pool_tokens"]), "/get_server_info sglang_sim.host_pool_tokens (simulator)"
    if host is None:
        out["note"] = (
            f"the host pool is not checked: SGLang 0.5.23 reports its size only in /metrics "
            f"{HOST_METRIC}, which needs --enable-metrics"
        )
        return out
    out["host_tokens"], out["host_source"] = host, source
    if config is None:
        out["note"] = f"the host pool is not checked: no readable config.json in {facts.get('model_path')!r}"
        return out
    if not isinstance(device, int) or device < 1:
        out["note"] = "the host pool is not checked: the server reports no device capacity"
        return out
    tp = int(_number(info.get("tp_size")) or 1)
    elem = None
    for name in (info.get("kv_cache_dtype"), info.get("dtype")):
        if name and str(name) != "auto":
            elem = DTYPE_BYTES.get(str(name), 2.0)
            break
    size_gb = _number(info.get("hicache_size")) or 0
    ratio = _number(info.get("hicache_ratio"))
    mode = str(info.get("hicache_host_memory_mode") or "cache")
    mamba = None
    if info.get("max_mamba_cache_size") is not None and is_hybrid(config):
        mamba = mamba_device_bytes(config, info, device)
    try:
        low, high, how = expected_host_range(
            config, tp, device, out["page_size"], size_gb, ratio, mode,
            mamba_device_bytes=None if mamba is None else (mamba[0], mamba[1]), elem_bytes=elem,
        )
        if mamba is not None and size_gb:
            how += f"; {mamba[2]}"
    except PoolPlanError as exc:
        out["note"] = f"the host pool is not checked: {exc}"
        return out
    if low < high and info.get("max_mamba_cache_size") is None:
        # Auto-sized Mamba pool (kv_cache_configurator.py): its budget is r / (1 + r) of the memory the
        # KV and Mamba pools share, so its device bytes are at most r x the KV pool's and the KV pool's
        # share of --hicache-size (_split_hicache_size) is at least 1 / (1 + r).
        r = _number(info.get("mamba_full_memory_ratio")) or DEFAULT_MAMBA_FULL_MEMORY_RATIO
        bpt = kv_bytes_per_token(config, tp, elem)
        low = host_tokens(bpt, device, out["page_size"], size_gb, ratio, mode, 1.0 / (1.0 + r))
        how = how.replace("its share unknown: upper bound only", f"KV share >= 1 / (1 + {r:g})")
    out["host_expected"] = [low, high]
    out["host_expected_how"] = how
    out["failures"] = compare("HiCache host pool", host, low, high, tolerance, how)
    return out


def hicache_cost(pools: Mapping[str, Any], baseline: Any) -> dict | None:
    """The device capacity now against the host's baseline (a result, report or rollout record of an
    earlier run); against a baseline without HiCache this is HiCache's GPU cost (the report's -31.5 %)."""
    if not isinstance(baseline, Mapping):
        return None
    server = baseline.get("server") or baseline.get("server_info") or baseline
    if not isinstance(server, Mapping):
        return None
    base = server.get("max_total_num_tokens")
    now = pools.get("device_tokens")
    if isinstance(base, bool) or not isinstance(base, int) or base < 1 or not isinstance(now, int):
        return None
    return {
        "baseline_device_tokens": base,
        "baseline_hicache": bool(server.get("enable_hierarchical_cache")),
        "device_tokens": now,
        "change_pct": round((now - base) * 100.0 / base, 1),
    }


def pool_gate_checks(result: Mapping[str, Any]) -> list[dict]:
    """The gate's checks of the pools (sglang_probe_gate.evaluate_gate adds them)."""
    pools = result.get("pools")
    if not isinstance(pools, Mapping):
        return []
    checks = []
    if pools.get("host_expected") is not None:
        failures = list(pools.get("failures") or [])
        checks.append({
            "name": "pools.host_tokens",
            "passed": not failures,
            "value": pools.get("host_tokens"),
            "limit": pools.get("host_expected"),
            "reason": "; ".join(failures) or None,
        })
    if pools.get("probe_failures"):
        checks.append({
            "name": "pools.probe_fits",
            "passed": False,
            "value": pools.get("host_tokens"),
            "limit": None,
            "reason": "; ".join(pools["probe_failures"]),
        })
    return checks


def check_pools(client: Any, server_info: Mapping[str, Any], facts: Mapping[str, Any]) -> dict:
    """After healthy, before the probe: fetch /metrics when the server exports it (--enable-metrics),
    read config.json from the model path on this host, and compare (server_pools)."""
    metrics = None
    if (
        facts.get("enable_hierarchical_cache")
        and isinstance(server_info, Mapping)
        and server_info.get("enable_metrics")
    ):
        status, data = client.request("GET", "/metrics")
        if status == 200:
            metrics = data.decode("utf-8", "replace")
    return server_pools(server_info, facts, metrics, read_model_config(facts.get("model_path")))
