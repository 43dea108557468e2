"""The simulated scheduler: admission, the prefill/decode timing model, cache use, metrics.

Timing (modelled seconds; the simulator sleeps modelled x SGLANG_SIM_TIME_SCALE):
    prefill = uncached_tokens / prefill_rate + host_hit_tokens / load_rate   (device hits: free)
    decode  = 1 / decode_rate per generated token after the first
Up to --max-running-requests requests run; the others queue. Prefills run one at a time (one
GPU batch), decodes of running requests overlap.
Which ids come out (greedy/sampled, a repeated block continued, the corrupt_* faults): output.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .cache import PrefixCache
from .model import ModelInfo, PoolSizes
from .output import CORRUPT_FROM, Output, input_logprob
from .settings import Settings
from .tokenizer import first_out_of_vocab, out_of_vocab_message, output_piece, token_text

# Prompts whose ids were already checked against the vocabulary (warm re-sends skip the scan).
VOCAB_CHECKED_KEEP = 8

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)


class StorageError(Exception):
    """The L3 storage backend cannot be set up (a startup failure, exit 1)."""


def parse_extra_config(raw: str | None) -> dict:
    """--hicache-storage-backend-extra-config: JSON, or '@file' (.json/.toml) as
    HybridCacheController.parse_storage_backend_extra_config."""
    if not raw:
        return {}
    try:
        if raw.startswith("@"):
            path = raw[1:]
            ext = os.path.splitext(path)[1].lower()
            if ext == ".json":
                with open(path) as f:
                    data = json.load(f)
            elif ext == ".toml":
                import tomllib
                with open(path, "rb") as f:
                    data = tomllib.load(f)
            else:
                raise StorageError(f"Unsupported config file {path} (config format: {ext})")
        else:
            data = json.loads(raw)
    except (OSError, ValueError) as err:
        raise StorageError(f"--hicache-storage-backend-extra-config: {err}") from None
    if not isinstance(data, dict):
        raise StorageError("--hicache-storage-backend-extra-config must be a JSON object")
    return data


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class SimRequest:
    tokens: bytes  # canonical prompt (tokenizer.canonical): b"12,345,"
    max_new_tokens: int = 128
    stream: bool = False
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    log_metrics: bool = True
    # When the request arrived (time.monotonic(), set by the HTTP layer before it reads the
    # body); the modelled time runs from here. None: when the engine first sees it.
    arrived: float | None = None
    # Sampling: greedy when temperature is 0 (or top_k is 1), as SGLang's sampling_params.py.
    greedy: bool = False
    sampling_seed: int | None = None
    # Logprobs (GenerateReqInput): -1 = output tokens only (SGLang's default).
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0


@dataclass
class Event:
    """One step of a request's output: token ``index`` (0-based) and cumulative state."""

    index: int
    piece: str
    token_id: int
    finished: bool
    meta: dict[str, Any]
    logprob: float = 0.0
    # top_logprobs_num > 0: [(logprob, id), ...] best first (the chosen token first when greedy)
    top: list[tuple[float, int]] | None = None


def modelled_wait(modelled_s: float, time_scale: float, spent_s: float) -> float:
    """Wall seconds still to sleep before the first token: the modelled prefill (scaled) minus
    the time the simulator already spent on this request since its prefill could have begun
    (reading and parsing a ~1 MB body, hashing, the cache match), never below 0. So a client
    measures the modelled TTFT plus only its network overhead."""
    return max(0.0, modelled_s * time_scale - max(0.0, spent_s))


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt_tokens: dict[str, int] = {"true": 0, "false": 0}
        self.generation_tokens: dict[str, int] = {"true": 0, "false": 0}
        self.num_requests: dict[str, int] = {"true": 0, "false": 0}
        self.cached_by_source: dict[str, int] = {}
        self.ttft: dict[str, list[float]] = {"true": [], "false": []}
        self.last_hit_rate = 0.0
        self.last_gen_throughput = 0.0


class Engine:
    def __init__(self, values: dict[str, Any], model: ModelInfo, sizes: PoolSizes,
                 settings: Settings, log) -> None:
        self.values = values
        self.model = model
        self.sizes = sizes
        self.settings = settings
        self.log = log
        self.page_size = int(values.get("page_size") or 1)
        self.context_len = int(values.get("context_length") or model.max_position_embeddings)
        self.max_running = int(values.get("max_running_requests") or 48)
        self.max_req_input_len = min(self.context_len - 1, sizes.device_tokens - 1) - 5
        self.hicache = bool(values.get("enable_hierarchical_cache"))
        faults = settings.faults
        self.host_tier_used = self.hicache and "ignore_host_tier" not in faults
        self.prefill_rate = settings.prefill_rate / (
            settings.slow_factor if "slow_prefill" in faults else 1.0
        )
        # degrade_under_traffic: generate requests answered so far (the fault slows those after the Nth)
        self.generate_count = 0
        self.prefetch_threshold = 256
        self.prefetch_policy = "timeout"
        self.prefetch_timeout_base, self.prefetch_timeout_per_ki = 1.0, 0.25
        self.storage = self._make_storage(values, sizes, settings, log) if self.hicache else None
        if not self.hicache and values.get("hicache_storage_backend"):
            log("SIMULATOR: --hicache-storage-backend is ignored without "
                "--enable-hierarchical-cache (no HiCache controller, as in SGLang 0.5.23)",
                "warning")
        self.storage_backend_type = "HiCacheFile" if self.storage is not None else None
        self.cache = PrefixCache(
            device_capacity=sizes.device_tokens,
            host_capacity=sizes.host_tokens,
            page_size=self.page_size,
            block_tokens=settings.block_tokens,
            write_policy=str(values.get("hicache_write_policy") or "write_through"),
            use_host=self.host_tier_used,
            storage=self.storage,
            prefetch_threshold=self.prefetch_threshold,
        )
        self.cache_lock = threading.Lock()
        self.gpu_lock = threading.Lock()
        self.cond = threading.Condition()
        self.running = 0
        self.queued = 0
        self.flush_pending = False
        self.metrics = Metrics()
        # When the GPU (the prefill lock) was last released: a request that arrived earlier
        # waited for it, so its modelled prefill starts then, not at its arrival.
        self.gpu_free_at = 0.0
        self.vocab_checked: OrderedDict[bytes, None] = OrderedDict()

    # ---------------------------------------------------------------- L3 storage
    def _make_storage(self, values, sizes, settings, log):
        """--hicache-storage-backend file as 0.5.23 sets it up (StorageError: startup fails)."""
        backend = values.get("hicache_storage_backend")
        if not backend:
            return None
        if backend != "file":
            raise StorageError(
                f"SIMULATOR: --hicache-storage-backend {backend} is not simulated; the SGLang "
                "simulator models only the 'file' backend (use --hicache-storage-backend file)")
        extra = parse_extra_config(values.get("hicache_storage_backend_extra_config"))
        threshold = extra.pop("prefetch_threshold", 256)
        if not isinstance(threshold, int):
            raise StorageError(
                f"prefetch_threshold must be int, got {type(threshold).__name__}")
        self.prefetch_threshold = threshold
        base = extra.pop("prefetch_timeout_base", 1)
        per_ki = extra.pop("prefetch_timeout_per_ki_token", 0.25)
        for name, val in (("prefetch_timeout_base", base),
                          ("prefetch_timeout_per_ki_token", per_ki)):
            if isinstance(val, bool) or not isinstance(val, (int, float)):
                raise StorageError(f"{name} must be number, got {type(val).__name__}")
        self.prefetch_timeout_base, self.prefetch_timeout_per_ki = float(base), float(per_ki)
        self.prefetch_policy = str(values.get("hicache_storage_prefetch_policy") or "timeout")
        extra.pop("hicache_storage_pass_prefix_keys", None)
        if values.get("file_storage_path"):
            extra.setdefault("file_storage_path", values["file_storage_path"])
        from .storage import DEFAULT_DIR, FileStorage
        env = dict(os.environ)
        path = (env.get("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR") or
                extra.get("file_storage_path") or DEFAULT_DIR)
        bpt = settings.storage_bytes_per_token or sizes.kv_bytes_per_token
        storage = FileStorage(file_path=path, model_path=str(values.get("model_path") or ""),
                              tp_size=int(values.get("tp_size") or 1), page_size=self.page_size,
                              bytes_per_token=bpt, extra=extra, env=env, log=log)
        log(f"SIMULATOR L3 storage: HiCacheFile at {path}, {storage.bytes_per_token} B per "
            f"token per rank, prefetch_threshold={threshold}, prefetch policy "
            f"{self.prefetch_policy} (timeout {base} s + {per_ki} s per 1024 tokens)")
        return storage

    def _prefetch_cut(self, match) -> None:
        """What of a storage hit arrives before the request runs, per
        --hicache-storage-prefetch-policy (unified_radix_cache._can_terminate_prefetch):
        wait_complete waits for all of it; timeout (0.5.23's default) waits at most
        base + per_ki_token x requested tokens / 1024 seconds (modelled seconds here) and keeps
        what was read by then; best_effort does not wait: an idle server schedules the request
        at once, so the simulator counts nothing as prefetched in time."""
        hit = match.storage_tokens
        if hit <= 0 or self.prefetch_policy == "wait_complete":
            return
        if self.prefetch_policy == "best_effort":
            kept = 0
        else:
            timeout = self.prefetch_timeout_base + self.prefetch_timeout_per_ki * hit / 1024
            kept = min(hit, int(timeout * self.settings.storage_load_rate))
            kept = kept // self.page_size * self.page_size
        if kept < hit:
            self.log(f"SIMULATOR prefetch ({self.prefetch_policy}) stopped at {kept} of {hit} "
                     "storage tokens")
            match.storage_tokens = kept

    # ---------------------------------------------------------------- helpers
    def scaled_sleep_until(self, deadline: float) -> None:
        delay = deadline - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def validate(self, req: SimRequest) -> None:
        n = req.tokens.count(b",")
        if n == 0:
            raise RequestError(400, "The input is empty.")
        if n >= self.context_len:
            raise RequestError(
                400,
                f"The input ({n} tokens) is longer than the model's context length "
                f"({self.context_len} tokens).",
            )
        if req.max_new_tokens + n > self.context_len:
            raise RequestError(
                400,
                "Requested token count exceeds the model's maximum context length of "
                f"{self.context_len} tokens. You requested a total of "
                f"{req.max_new_tokens + n} tokens: {n} tokens from the input messages and "
                f"{req.max_new_tokens} tokens for the completion. Please reduce the number of "
                "tokens in the input messages or the completion to fit within the limit.",
            )
        if n >= self.max_req_input_len:
            raise RequestError(
                400,
                f"Input length ({n} tokens) exceeds the maximum allowed length "
                f"({self.max_req_input_len} tokens). Use a shorter input or enable "
                "--allow-auto-truncate.",
            )
        self.check_vocab(req.tokens)
        if req.return_logprob and req.logprob_start_len > n:
            # scheduler.py: the request is aborted; the tokenizer manager answers 400.
            raise RequestError(
                400,
                f"req.logprob_start_len={req.logprob_start_len} is higher than the number of "
                f"input tokens len(req.origin_input_ids)={n}. Please use a smaller "
                "logprob_start_len.",
            )

    def check_vocab(self, data: bytes) -> None:
        """400 for an id outside [0, vocab_size). SGLang 0.5.23 itself has no such check on
        input_ids (an out-of-range id fails in the embedding lookup); the simulator answers as
        its tokenizer manager answers the one vocabulary check it has."""
        if data in self.vocab_checked:
            self.vocab_checked.move_to_end(data)
            return
        vocab = self.model.vocab_size
        bad = first_out_of_vocab(data, vocab)
        if bad is not None:
            raise RequestError(400, out_of_vocab_message(bad, vocab))
        self.vocab_checked[data] = None
        while len(self.vocab_checked) > VOCAB_CHECKED_KEEP:
            self.vocab_checked.popitem(last=False)

    def busy(self) -> bool:
        return self.running > 0 or self.queued > 0

    # ---------------------------------------------------------------- flush
    def flush(self, timeout: float) -> tuple[bool, str]:
        with self.cond:
            if self.flush_pending:
                return False, "Another flush_cache is already in progress."
            if self.busy():
                if timeout <= 0:
                    self.log(
                        "Cache not flushed because there are pending requests. "
                        f"#queue-req: {self.queued}, #running-req: {self.running}"
                    )
                    return False, ""
                self.flush_pending = True
                try:
                    deadline = time.monotonic() + timeout
                    while self.busy():
                        left = deadline - time.monotonic()
                        if left <= 0:
                            self.log("Deferred flush_cache timed out while waiting for idle state.")
                            return False, "Timed out waiting for idle state."
                        self.cond.wait(left)
                finally:
                    self.flush_pending = False
            with self.cache_lock:
                self.cache.flush()
            self.log("Cache flushed successfully!")
            return True, ""

    # ---------------------------------------------------------------- running
    def run(self, req: SimRequest) -> Iterator[Event]:
        """Run a request; yields one Event per generated token (at least one)."""
        self.validate(req)
        if "generate_500" in self.settings.faults:
            raise RequestError(500, "[sglang-sim] SIMULATOR fault generate_500: internal error")
        scale = self.settings.time_scale
        t_arrive = req.arrived if req.arrived is not None else time.monotonic()
        t_slot = t_arrive
        with self.cond:
            self.queued += 1
            try:
                while self.running >= self.max_running:
                    self.cond.wait()
                    t_slot = time.monotonic()  # waited for a running slot: ready from now
            finally:
                self.queued -= 1
            self.running += 1
        data = req.tokens
        n = data.count(b",")
        locked: list[int] = []
        try:
            with self.gpu_lock:
                # The modelled prefill begins once the request is here and the GPU is free.
                t_start = max(t_slot, self.gpu_free_at)
                with self.cache_lock:
                    match = self.cache.match(self._match_limit(req, data))
                    locked = match.path
                    self.cache.lock(locked, +1)
                self._prefetch_cut(match)
                uncached = n - match.cached_tokens
                # a storage hit is read from disk into the host pool, then loaded like a host hit
                modelled = (uncached / self.prefill_rate
                            + (match.host_tokens + match.storage_tokens) / self.settings.load_rate
                            + match.storage_tokens / self.settings.storage_load_rate)
                self.generate_count += 1
                if ("degrade_under_traffic" in self.settings.faults
                        and self.generate_count > self.settings.degrade_after):
                    # slower prefill, and even a cached prompt pays part of a cold one (a pool under pressure)
                    modelled = (modelled * self.settings.slow_factor
                                + 0.05 * (self.settings.slow_factor - 1) * n / self.prefill_rate)
                wait = modelled_wait(modelled, scale, time.monotonic() - t_start)
                if wait > 0:
                    time.sleep(wait)
                with self.cache_lock:
                    self.cache.lock(locked, -1)
                    locked = []
                    self.cache.insert(data, match.path)
                self.gpu_free_at = time.monotonic()
            t_first = time.monotonic()
            ttft = t_first - t_arrive
            out = Output(data, self.model.vocab_size, greedy=req.greedy,
                         sampling_seed=req.sampling_seed,
                         corrupt_from=self._corrupt_from(match.device_tokens, match.host_tokens))
            meta_base = {
                "prompt_tokens": n,
                "cached_tokens": match.cached_tokens,
                "details": self._details(match.device_tokens, match.host_tokens,
                                         match.storage_tokens),
                "ttft": ttft,
                "input_logprobs": self._input_logprobs(req, data, out) if req.return_logprob
                else None,
                "sim": {
                    "simulator": True,
                    "modelled_prefill_s": modelled,
                    "uncached_tokens": uncached,
                    "device_hit_tokens": match.device_tokens,
                    "host_hit_tokens": match.host_tokens,
                    "storage_hit_tokens": match.storage_tokens,
                    "time_scale": scale,
                    "queue_s": t_start - t_arrive,
                    "corrupted_from": out.corrupt_from,
                },
            }
            total = max(0, req.max_new_tokens)
            if total == 0:
                self._record(req, n, 0, match.device_tokens, match.host_tokens, ttft,
                             match.storage_tokens)
                yield Event(-1, "", 0, True, dict(meta_base, completion_tokens=0))
                return
            decode_dt = scale / self.settings.decode_rate
            cut_after = self.settings.cut_after if "cut_stream" in self.settings.faults else None
            for i in range(total):
                if i:
                    self.scaled_sleep_until(t_first + i * decode_dt)
                if cut_after is not None and i >= max(1, cut_after) and req.stream:
                    raise ConnectionAbortedError("[sglang-sim] SIMULATOR fault cut_stream")
                finished = i == total - 1
                if finished:
                    self._record(req, n, total, match.device_tokens, match.host_tokens, ttft,
                                 match.storage_tokens)
                    elapsed = time.monotonic() - t_first
                    if elapsed > 0 and total > 1:
                        self.metrics.last_gen_throughput = (total - 1) / elapsed
                token_id, logprob = out.token(i)
                top = self._top(out, i, token_id, logprob, req.top_logprobs_num) \
                    if req.return_logprob and req.top_logprobs_num > 0 else None
                yield Event(i, output_piece(token_id), token_id, finished,
                            dict(meta_base, completion_tokens=i + 1), logprob, top)
        finally:
            if locked:
                with self.cache_lock:
                    self.cache.lock(locked, -1)
            with self.cond:
                self.running -= 1
                self.cond.notify_all()

    def _match_limit(self, req: SimRequest, data: bytes) -> bytes:
        """The prompt as the prefix match sees it. schedule_batch.py _compute_max_prefix_len:
        with return_logprob and logprob_start_len >= 0 at most logprob_start_len tokens come
        from the cache (the match already leaves the last token to compute)."""
        start = req.logprob_start_len
        if not req.return_logprob or start < 0:
            return data
        parts = data.split(b",", start + 1)
        if len(parts) <= start + 1:
            return data
        return data[:sum(len(p) + 1 for p in parts[:start + 1])]

    def _corrupt_from(self, device: int, host: int) -> int | None:
        """The corrupt_* faults: the index from which the output differs from the clean one."""
        faults = self.settings.faults
        if "corrupt_host_tier" in faults and host > 0:
            return CORRUPT_FROM
        if "corrupt_device_tier" in faults and device > 0 and host == 0:
            return CORRUPT_FROM
        return None

    def _input_logprobs(self, req: SimRequest, data: bytes, out: Output) -> dict[str, list]:
        """Prompt logprobs from logprob_start_len on (logprob_result_processor.py: the first
        value is None, the ids are origin_input_ids[logprob_start_len:]); none by default."""
        start = req.logprob_start_len
        n = data.count(b",")
        if start < 0 or start >= n:
            return {"token": [], "top": []}
        ids = [int(p) for p in data.split(b",")[start:-1]]
        values: list[float | None] = [None] + [input_logprob(out.digest, start + j)
                                               for j in range(1, len(ids))]
        token = [(v, i, token_text(i)) for v, i in zip(values, ids, strict=True)]
        top: list = []
        if req.top_logprobs_num > 0:
            top = [None] + [
                [(v, i, token_text(i))] + [
                    (round(v - 0.5 - r, 6), alt, token_text(alt))
                    for r in range(req.top_logprobs_num - 1)
                    for alt in ((i + 7919 * (r + 1)) % out.vocab,)]
                for v, i in zip(values[1:], ids[1:], strict=True)
            ]
        return {"token": token, "top": top}

    def _top(self, out: Output, index: int, token_id: int, logprob: float,
             k: int) -> list[tuple[float, int]]:
        """The k best tokens at an output position; greedy picks the first."""
        rows = [(logprob, token_id)]
        for r in range(1, k):
            rows.append((round(min(logprob, -0.001) - 0.7 * r - 0.5, 6),
                         (token_id + 104_729 * r + index) % out.vocab))
        return rows

    def _details(self, device: int, host: int, storage: int = 0) -> dict[str, Any] | None:
        """output_streamer.get_cached_tokens_details: storage and storage_backend (the backend
        class name) only when an L3 backend is attached."""
        if device > 0 or host > 0 or storage > 0:
            details: dict[str, Any] = {"device": device, "host": host}
            if self.storage is not None:
                details["storage"] = storage
                details["storage_backend"] = self.storage_backend_type
            return details
        return None

    def _record(self, req: SimRequest, prompt: int, completion: int, device: int, host: int,
                ttft: float, storage: int = 0) -> None:
        if not req.log_metrics:
            return
        label = "true" if req.stream else "false"
        m = self.metrics
        with m.lock:
            m.prompt_tokens[label] += prompt
            m.generation_tokens[label] += completion
            m.num_requests[label] += 1
            for source, value in (("device", device), ("host", host), ("storage", storage)):
                if value > 0:
                    m.cached_by_source[source] = m.cached_by_source.get(source, 0) + value
            m.ttft[label].append(ttft)
            m.last_hit_rate = (device + host + storage) / prompt if prompt else 0.0

    # ---------------------------------------------------------------- state
    def snapshot(self) -> dict[str, Any]:
        with self.cache_lock:
            return {
                "device_used_tokens": self.cache.device_used,
                "host_used_tokens": self.cache.host_used,
                "cached_blocks": len(self.cache.nodes),
                "running": self.running,
                "queued": self.queued,
                **(self.storage.snapshot() if self.storage is not None else {}),
            }
