"""Model directory reading and the device/host pool sizing arithmetic.

KV bytes per token per rank = full-attention layers x 2 (K and V) x KV heads on this rank x
head_dim x bytes per element. Linear-attention (Mamba/GDN) layers of a hybrid model keep a
fixed-size state per request instead of a per-token KV, so they do not count here.

Device pool (tokens), per rank, as SGLang sizes it:
    D = floor((gpu_bytes x mem_fraction_static - weights/tp - reserved - hicache_device)
              / kv_bytes_per_token_per_rank), rounded down to the page size
where ``reserved`` stands for what else the static fraction holds (the Mamba state pool,
workspace), and ``hicache_device`` is the extra device memory taken when HiCache is on. The
defaults reproduce the seed's measured capacities with the seed-27b fixture (see README).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .settings import Settings

GIB = 1024**3

DTYPE_BYTES = {
    "float32": 4.0, "float": 4.0, "float16": 2.0, "half": 2.0, "bfloat16": 2.0, "bf16": 2.0,
    "fp8_e5m2": 1.0, "fp8_e4m3": 1.0, "mxfp8": 1.0, "nvfp4": 0.5, "fp4_mx_block16": 0.5,
}


class StartupError(RuntimeError):
    """The server cannot start; SGLang would exit with a traceback."""


@dataclass(frozen=True)
class ModelInfo:
    path: str
    config: dict[str, Any]
    architectures: list[str]
    model_type: str | None
    vocab_size: int
    max_position_embeddings: int
    num_layers: int
    full_attention_layers: int
    num_kv_heads: int
    head_dim: int
    torch_dtype: str


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    merged = dict(config)
    if isinstance(config.get("text_config"), dict):
        merged.update(config["text_config"])
    return merged


def read_model(path: str) -> ModelInfo:
    config_path = Path(path) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise StartupError(
            f"OSError: Can't load the configuration of '{path}'. It must be a local "
            f"directory containing a config.json file."
        ) from None
    except (OSError, json.JSONDecodeError) as err:
        raise StartupError(f"Can't read {config_path}: {err}") from None
    text = _text_config(config)
    layers = int(text.get("num_hidden_layers", 0) or 0)
    heads = int(text.get("num_attention_heads", 1) or 1)
    kv_heads = int(text.get("num_key_value_heads", heads) or heads)
    hidden = int(text.get("hidden_size", 0) or 0)
    head_dim = int(text.get("head_dim") or (hidden // heads if hidden else 128))
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        full = sum(1 for t in layer_types if "full" in str(t) or t == "attention")
    elif text.get("full_attention_interval"):
        full = layers // int(text["full_attention_interval"])
    else:
        full = layers
    if layers <= 0 or full <= 0:
        raise StartupError(f"{config_path}: num_hidden_layers / attention layers missing")
    return ModelInfo(
        path=path,
        config=config,
        architectures=list(config.get("architectures") or []),
        model_type=config.get("model_type"),
        vocab_size=int(text.get("vocab_size", 32000)),
        max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
        num_layers=layers,
        full_attention_layers=full,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        torch_dtype=str(text.get("torch_dtype") or text.get("dtype") or "bfloat16"),
    )


def kv_dtype_bytes(model: ModelInfo, kv_cache_dtype: str, dtype: str) -> float:
    if kv_cache_dtype and kv_cache_dtype != "auto":
        return DTYPE_BYTES.get(kv_cache_dtype, 2.0)
    if dtype and dtype != "auto":
        return DTYPE_BYTES.get(dtype, 2.0)
    return DTYPE_BYTES.get(model.torch_dtype, 2.0)


def kv_bytes_per_token_per_rank(model: ModelInfo, tp_size: int, elem_bytes: float) -> int:
    kv_heads_per_rank = max(1, model.num_kv_heads // tp_size)
    return int(model.full_attention_layers * 2 * kv_heads_per_rank * model.head_dim * elem_bytes)


_MAMBA_SSM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def mamba_pool_bytes(model: ModelInfo, values: dict[str, Any], device_tokens: int) -> int | None:
    """Bytes per rank of SGLang 0.5.23's Mamba device pool for a hybrid GDN model (qwen3_5/qwen3_next)
    with an explicit --max-mamba-cache-size, or None (dense model, auto-sized pool, not modelled).

    Mirrors srt/configs/mamba_utils.py Mamba2StateShape.create (conv state (conv_dim / tp, kernel - 1) in
    bf16, SSM state (value heads / tp, value dim, key dim) in --mamba-ssm-dtype, else config, else
    float32), srt/mem_cache/memory_pool.py MambaPool (size + 1 slots; with speculative decoding the
    verify scratch intermediate_ssm and intermediate_conv_window of max_num_reqs + 1 slots x draft
    tokens) and kv_cache_configurator.py resolve_max_num_reqs (min(--max-running-requests, device // 2,
    max_mamba_cache_size // 3): the radix ratio's default; the simulator runs no extra buffer).
    module_utils/sglang_pool_plan.py mamba_device_bytes is the controller's own copy; tests/sim compares.
    """
    slots = values.get("max_mamba_cache_size")
    text = _text_config(model.config)
    keys = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim")
    if slots is None or model.full_attention_layers >= model.num_layers or not all(text.get(k) for k in keys):
        return None
    tp = int(values.get("tp_size") or 1)
    groups = int(text["linear_num_key_heads"])
    if groups % tp:
        groups = tp  # extra_groups_for_head_shards adds tp - groups
    conv_dim = int(text["linear_value_head_dim"]) * int(text["linear_num_value_heads"]) + 2 * groups * int(
        text["linear_key_head_dim"])
    conv = conv_dim // tp * (int(text["linear_conv_kernel_dim"]) - 1) * 2
    ssm_dtype = values.get("mamba_ssm_dtype") or text.get("mamba_ssm_dtype") or "float32"
    ssm = (int(text["linear_num_value_heads"]) // tp * int(text["linear_value_head_dim"])
           * int(text["linear_key_head_dim"]) * _MAMBA_SSM_BYTES.get(str(ssm_dtype), 4))
    layers = model.num_layers - model.full_attention_layers
    total = layers * (int(slots) + 1) * (conv + ssm)
    drafts = values.get("speculative_num_draft_tokens")
    if values.get("speculative_algorithm") and drafts:
        reqs = values.get("max_running_requests") or 10**9
        ratio = 1 if values.get("disable_radix_cache") else 3
        spec = min(int(reqs), device_tokens // 2, int(slots) // ratio)
        total += layers * (spec + 1) * int(drafts) * (conv + ssm)
    return total


@dataclass(frozen=True)
class PoolSizes:
    kv_bytes_per_token: int  # per rank
    device_tokens: int  # max_total_num_tokens
    host_tokens: int  # 0 without HiCache
    weights_gb_per_rank: float
    kv_cache_gb_per_rank: float
    available_gpu_gb: float
    host_bytes_requested_per_rank: int


def size_pools(model: ModelInfo, values: dict[str, Any], settings: Settings) -> PoolSizes:
    tp = int(values["tp_size"])
    page = int(values.get("page_size") or 1)
    elem = kv_dtype_bytes(model, values.get("kv_cache_dtype") or "auto", values.get("dtype"))
    bpt = kv_bytes_per_token_per_rank(model, tp, elem)
    hicache = bool(values.get("enable_hierarchical_cache"))
    cards = settings.gpu_mem_gib
    if tp > len(cards):
        raise StartupError(
            f"RuntimeError: tp_size={tp} needs {tp} GPUs but only {len(cards)} are visible "
            f"(SGLANG_SIM_GPU_MEM_GB={','.join(str(c) for c in cards)})"
        )
    gpu_bytes = min(cards[:tp]) * GIB
    frac = float(values.get("mem_fraction_static") or 0.8)
    weights = settings.weights_gb * 1e9 / tp
    static = gpu_bytes * frac - weights - settings.reserved_gb * 1e9
    if hicache:
        static -= settings.hicache_device_gb * 1e9
    if settings.device_tokens is not None:
        device = int(settings.device_tokens)
    else:
        device = int(static // bpt)
    device = device // page * page
    if device <= 0:
        raise StartupError(
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"(simulated GPU {min(cards[:tp]):g} GiB x {frac} leaves no room for the KV cache)"
        )
    host = 0
    requested = 0
    if hicache:
        if settings.host_tokens is not None:
            host = int(settings.host_tokens)
        elif int(values.get("hicache_size") or 0) > 0:
            # hybrid_pool_assembler.py _split_hicache_size: the GB are shared with the Mamba host pool in
            # proportion of the device pools' bytes (the KV pool: device + 1 page rows of K and V).
            gb = float(values["hicache_size"])
            mamba = mamba_pool_bytes(model, values, device)
            if mamba:
                kv = (device + page) * bpt
                gb = gb * kv / (kv + mamba)
            host = int(gb * 1e9 // bpt)
        else:
            ratio = values.get("hicache_ratio")
            if ratio is None:
                ratio = 1.2 if values.get("hicache_host_memory_mode") == "buffer_only" else 2.0
            host = int(device * float(ratio))
        if "pool_mismatch" in settings.faults:
            host //= 2  # the fault: a host pool of half the configured size, used and reported as such
        host = (host // page + 1) * page  # SGLang reserves one padding page
        requested = host * bpt
    return PoolSizes(
        kv_bytes_per_token=bpt,
        device_tokens=device,
        host_tokens=host,
        weights_gb_per_rank=weights / 1e9,
        kv_cache_gb_per_rank=device * bpt / GIB,
        available_gpu_gb=(gpu_bytes * (1 - frac)) / GIB,
        host_bytes_requested_per_rank=requested,
    )


def host_memory_available_bytes(settings: Settings) -> int:
    if settings.host_mem_available_gb is not None:
        return int(settings.host_mem_available_gb * 1e9)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def check_host_memory(sizes: PoolSizes, tp: int, settings: Settings) -> None:
    """SGLang's check: each rank's host pool must fit in its share of the free RAM."""
    if not sizes.host_tokens:
        return
    share = host_memory_available_bytes(settings) // tp
    if sizes.host_bytes_requested_per_rank > share:
        raise StartupError(
            "ValueError: Not enough host memory available. Requesting "
            f"{sizes.host_bytes_requested_per_rank / 1e9:.2f} GB but only have "
            f"{share / 1e9:.2f} GB free. Please reduce the size of the hierarchical cache."
        )
