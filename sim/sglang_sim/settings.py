"""Simulator knobs. They come only from environment variables; argv stays SGLang's."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

FAULTS = (
    "startup_exit",
    "never_healthy",
    "generate_500",
    "cut_stream",
    "ignore_host_tier",
    "slow_prefill",
    "corrupt_host_tier",
    "corrupt_device_tier",
    "pool_mismatch",
    # Issue 28: TTFT grows by SGLANG_SIM_SLOW_FACTOR once the server has answered
    # SGLANG_SIM_DEGRADE_AFTER generate requests: any single probe (a few requests) passes, real
    # traffic afterwards sees it (what a bake on live metrics must catch).
    "degrade_under_traffic",
)

# Calibration to the seed report (two RX 7900 XTX, TP=2, 27B W4A16 hybrid model):
# a cold 128,000-token prompt takes about 192 s to the first token, a warm host-tier hit 2.65 s.
SEED_PROMPT_TOKENS = 128_000
DEFAULT_PREFILL_RATE = SEED_PROMPT_TOKENS / 192.0  # tokens/s computed on the GPU
DEFAULT_LOAD_RATE = SEED_PROMPT_TOKENS / 2.65  # tokens/s loaded back from the host tier
# L3 file storage read, NOT measured: 2 GB/s of NVMe read over 65,536 B/token (32,768 B per rank
# x 2 ranks) = 30,518 tokens/s; the pages then go host -> device at the host load rate.
DEFAULT_STORAGE_LOAD_RATE = 2e9 / 65_536


class SettingsError(ValueError):
    """An environment variable of the simulator has an unusable value."""


def _float(env: dict[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be >= {minimum}")
    return value


def _optional_float(env: dict[str, str], name: str) -> float | None:
    if env.get(name, "") == "":
        return None
    return _float(env, name, 0.0)


def _gpu_list(env: dict[str, str]) -> list[float]:
    raw = env.get("SGLANG_SIM_GPU_MEM_GB", "") or "24,24"
    try:
        cards = [float(part) for part in raw.replace("x", ",").split(",") if part.strip()]
    except ValueError:
        raise SettingsError(f"SGLANG_SIM_GPU_MEM_GB={raw!r}: expected e.g. '24,24'") from None
    if not cards or any(c <= 0 for c in cards):
        raise SettingsError(f"SGLANG_SIM_GPU_MEM_GB={raw!r}: expected e.g. '24,24'")
    return cards


@dataclass(frozen=True)
class Settings:
    time_scale: float = 1.0
    gpu_mem_gib: list[float] = field(default_factory=lambda: [24.0, 24.0])
    device_tokens: int | None = None
    host_tokens: int | None = None
    weights_gb: float = 17.9
    reserved_gb: float = 4.0241
    hicache_device_gb: float = 2.40894
    host_mem_available_gb: float | None = None
    load_delay_s: float = 2.0
    prefill_rate: float = DEFAULT_PREFILL_RATE
    load_rate: float = DEFAULT_LOAD_RATE
    storage_load_rate: float = DEFAULT_STORAGE_LOAD_RATE
    storage_bytes_per_token: int | None = None  # None: the model's KV bytes per token per rank
    decode_rate: float = 25.0
    slow_factor: float = 10.0
    cut_after: int = 2
    degrade_after: int = 100
    block_tokens: int = 128
    fault: str = ""

    @property
    def faults(self) -> frozenset[str]:
        return frozenset(f for f in self.fault.split(",") if f)


def load_settings(env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ if env is None else env)
    fault = env.get("SGLANG_SIM_FAULT", "").strip()
    for name in filter(None, fault.split(",")):
        if name not in FAULTS:
            raise SettingsError(
                f"SGLANG_SIM_FAULT={fault!r}: unknown fault {name!r}; one of {', '.join(FAULTS)}"
            )
    device = _optional_float(env, "SGLANG_SIM_DEVICE_TOKENS")
    host = _optional_float(env, "SGLANG_SIM_HOST_TOKENS")
    return Settings(
        time_scale=_float(env, "SGLANG_SIM_TIME_SCALE", 1.0),
        gpu_mem_gib=_gpu_list(env),
        device_tokens=None if device is None else int(device),
        host_tokens=None if host is None else int(host),
        weights_gb=_float(env, "SGLANG_SIM_WEIGHTS_GB", 17.9),
        reserved_gb=_float(env, "SGLANG_SIM_RESERVED_GB", 4.0241),
        hicache_device_gb=_float(env, "SGLANG_SIM_HICACHE_DEVICE_GB", 2.40894),
        host_mem_available_gb=_optional_float(env, "SGLANG_SIM_HOST_MEM_GB"),
        load_delay_s=_float(env, "SGLANG_SIM_LOAD_DELAY_S", 2.0),
        prefill_rate=_float(env, "SGLANG_SIM_PREFILL_RATE", DEFAULT_PREFILL_RATE, 1e-9),
        load_rate=_float(env, "SGLANG_SIM_LOAD_RATE", DEFAULT_LOAD_RATE, 1e-9),
        storage_load_rate=_float(env, "SGLANG_SIM_STORAGE_LOAD_RATE",
                                 DEFAULT_STORAGE_LOAD_RATE, 1e-9),
        storage_bytes_per_token=None if _optional_float(env, "SGLANG_SIM_STORAGE_BYTES_PER_TOKEN")
        is None else int(_float(env, "SGLANG_SIM_STORAGE_BYTES_PER_TOKEN", 0, 8)),
        decode_rate=_float(env, "SGLANG_SIM_DECODE_RATE", 25.0, 1e-9),
        slow_factor=_float(env, "SGLANG_SIM_SLOW_FACTOR", 10.0, 1.0),
        cut_after=int(_float(env, "SGLANG_SIM_CUT_AFTER", 2)),
        degrade_after=max(0, int(_float(env, "SGLANG_SIM_DEGRADE_AFTER", 100))),
        block_tokens=max(1, int(_float(env, "SGLANG_SIM_BLOCK_TOKENS", 128, 1))),
        fault=fault,
    )
