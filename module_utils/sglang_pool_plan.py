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

import math
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


def expected_host_range(
    config: Mapping[str, Any],
    tp_size: int,
    device_tokens: int,
    page_size: int = 1,
    hicache_size_gb: float = 0,
    hicache_ratio: float | None = None,
    host_memory_mode: str = "cache",
    mamba_device_bytes: float | None = None,
    elem_bytes: float | None = None,
) -> tuple[int, int, str]:
    """(lowest, highest, how) host KV tokens per rank the plan allows.

    Exact (lowest == highest) for a dense model, for --hicache-ratio, and for a hybrid model whose Mamba
    device pool bytes are known; a hybrid model with --hicache-size and unknown Mamba bytes gets
    (1 page, all GB to KV): only the upper bound is known.
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
    share = kv_share(int(device_tokens) * bpt, mamba_device_bytes)
    exact = host_tokens(bpt, device_tokens, page, hicache_size_gb, hicache_ratio, host_memory_mode, share)
    return exact, exact, how + f" x KV share {share:.4f} + 1 padding page"


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
