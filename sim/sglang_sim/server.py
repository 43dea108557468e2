"""The HTTP side: SGLang 0.5.23's routes and response shapes over http.server.

Field-for-field sources in the SGLang 0.5.23 wheel: sglang/srt/entrypoints/http_server.py
(routes, /server_info = resolved server args + launch_command + scheduler init info +
startup_time + internal_states + version + frontend), managers/tokenizer_manager.py (meta_info),
entrypoints/openai/protocol.py and serving_completions.py / serving_chat.py (OpenAI shapes),
observability/metrics_collector.py (metric names), utils/auth.py (API key rules).
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import LOG_TAG, SGLANG_VERSION, SIM_VERSION
from .engine import TTFT_BUCKETS, Engine, Event, RequestError, SimRequest
from .tokenizer import (
    IdsFormatError,
    OutOfVocabError,
    canonical,
    ids_segment_to_canonical,
    out_of_vocab_message,
    output_piece,
    render_chat,
    tokenize,
)

OPEN_PATHS = ("/health", "/ready", "/metrics")


class SimState:
    """Everything the handlers read: parsed args, engine, status."""

    def __init__(self, args, model, sizes, settings, engine: Engine, log) -> None:
        self.args = args
        self.values: dict[str, Any] = args.values
        self.model = model
        self.sizes = sizes
        self.settings = settings
        self.engine = engine
        self.log = log
        self.status = "starting"  # -> "up"
        self.startup_time = 0.0
        self.started_at = time.time()

    @property
    def served_model_name(self) -> str:
        return self.values.get("served_model_name") or self.values["model_path"]

    # ------------------------------------------------------------ server info
    def scheduler_info(self) -> dict[str, Any]:
        return {
            "status": "ready",
            "max_total_num_tokens": self.sizes.device_tokens,
            "max_req_input_len": self.engine.max_req_input_len,
            "startup_time": self.startup_time,
            # disabled_l3_layout(): no L3 storage backend is simulated.
            "hicache_object_layout": {
                "enabled": False,
                "backend": None,
                "page_size": self.engine.page_size,
                "hicache_object_layout": {"pools": []},
                "reason": "Hierarchical cache is disabled" if not self.engine.hicache
                else "HiCache controller is not attached",
            },
        }

    def sim_block(self) -> dict[str, Any]:
        e = self.engine
        return {
            "simulator": True,
            "name": "sglang-sim",
            "note": "SIMULATOR: a test double of SGLang; no model runs, no GPU is used.",
            "sim_version": SIM_VERSION,
            "kv_bytes_per_token_per_rank": self.sizes.kv_bytes_per_token,
            "device_pool_tokens": self.sizes.device_tokens,
            "host_pool_tokens": self.sizes.host_tokens,
            "host_tier_in_use": e.host_tier_used,
            "storage_tier_in_use": e.storage is not None,
            "storage_load_rate_tokens_per_s": self.settings.storage_load_rate,
            "fault": self.settings.fault or None,
            "time_scale": self.settings.time_scale,
            "prefill_rate_tokens_per_s": e.prefill_rate,
            "load_rate_tokens_per_s": self.settings.load_rate,
            "decode_rate_tokens_per_s": self.settings.decode_rate,
            "ignored_flags": list(self.args.ignored_flags),
            "unknown_flags": list(self.args.unknown_flags),
            **e.snapshot(),
        }

    def internal_state(self) -> dict[str, Any]:
        state = dict(self.values)
        tp = int(self.values["tp_size"])
        state.update(
            {
                "world_size": tp,
                "startup_time": self.startup_time,
                "effective_max_running_requests_per_dp": self.engine.max_running,
                "last_gen_throughput": self.engine.metrics.last_gen_throughput,
                "memory_usage": {
                    "weight": round(self.sizes.weights_gb_per_rank, 3),
                    "kvcache": round(self.sizes.kv_cache_gb_per_rank, 3),
                    "startup_available": round(self.sizes.available_gpu_gb, 3),
                    "token_capacity": self.sizes.device_tokens,
                    "token_capacity_swa": None,
                    "graph": {},
                },
            }
        )
        return state

    def server_info(self) -> dict[str, Any]:
        info = dict(self.values)
        info["launch_command"] = self.args.launch_command
        info.update(self.scheduler_info())
        info["kv_events"] = None
        info["startup_time"] = self.startup_time
        info["internal_states"] = [self.internal_state()]
        info["version"] = SGLANG_VERSION
        info["frontend"] = "python"
        info["sglang_sim"] = self.sim_block()
        return info

    def model_info(self) -> dict[str, Any]:
        v = self.values
        return {
            "model_path": v["model_path"],
            "served_model_name": self.served_model_name,
            "tokenizer_path": v.get("tokenizer_path") or v["model_path"],
            "is_generation": True,
            "preferred_sampling_params": v.get("preferred_sampling_params"),
            "weight_version": v.get("weight_version") or "default",
            "load_format": v.get("load_format"),
            "reasoning_parser": v.get("reasoning_parser"),
            "tool_call_parser": v.get("tool_call_parser"),
            "disaggregation_mode": v.get("disaggregation_mode"),
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": self.model.model_type,
            "architectures": self.model.architectures or None,
        }

    def model_card(self, name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": self.engine.context_len,
        }

    # ------------------------------------------------------------ metrics
    def metrics_text(self) -> str:
        e = self.engine
        m = e.metrics
        base = {
            "model_name": self.served_model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        tok_labels = {"model_name": self.served_model_name, "engine_type": "unified"}
        snap = e.snapshot()
        out: list[str] = [f"# {LOG_TAG} SIMULATOR metrics (sglang-sim {SIM_VERSION})"]

        def fmt(labels: dict[str, str]) -> str:
            return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

        def gauge(name: str, doc: str, value: float) -> None:
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} gauge")
            out.append(f"{name}{fmt(base)} {float(value)}")

        gauge("sglang:num_running_reqs", "The number of running requests.", snap["running"])
        gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
              snap["queued"])
        gauge("sglang:gen_throughput", "The generation throughput (token/s).",
              m.last_gen_throughput)
        gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", m.last_hit_rate)
        gauge("sglang:token_usage", "The token usage.",
              snap["device_used_tokens"] / max(1, self.sizes.device_tokens))
        if e.hicache:
            gauge("sglang:hicache_host_used_tokens",
                  "Number of tokens currently used in the host KV cache.",
                  snap["host_used_tokens"])
            gauge("sglang:hicache_host_total_tokens",
                  "Total capacity of the host KV cache in tokens.", self.sizes.host_tokens)
        with m.lock:
            counters = [
                ("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                 "is_streaming", m.prompt_tokens),
                ("sglang:generation_tokens_total", "Number of generation tokens processed.",
                 "is_streaming", m.generation_tokens),
                ("sglang:num_requests_total", "Number of requests processed.",
                 "is_streaming", m.num_requests),
                ("sglang:cached_tokens_total",
                 "Number of cached prompt tokens by source (device/host/storage).",
                 "cache_source", m.cached_by_source),
            ]
            for name, doc, label, series in counters:
                family = name[: -len("_total")]
                out.append(f"# HELP {family} {doc}")
                out.append(f"# TYPE {family} counter")
                for key, value in sorted(series.items()):
                    out.append(f"{name}{fmt({**tok_labels, label: key})} {float(value)}")
            family = "sglang:time_to_first_token_seconds"
            out.append(f"# HELP {family} Histogram of time to first token in seconds.")
            out.append(f"# TYPE {family} histogram")
            for stream, samples in sorted(m.ttft.items()):
                labels = {**tok_labels, "is_streaming": stream}
                for bound in TTFT_BUCKETS:
                    count = sum(1 for s in samples if s <= bound)
                    out.append(f"{family}_bucket{fmt({**labels, 'le': str(float(bound))})} "
                               f"{float(count)}")
                out.append(f"{family}_bucket{fmt({**labels, 'le': '+Inf'})} "
                           f"{float(len(samples))}")
                out.append(f"{family}_count{fmt(labels)} {float(len(samples))}")
                out.append(f"{family}_sum{fmt(labels)} {float(sum(samples))}")
        return "\n".join(out) + "\n"


def _sampling(req: SimRequest, params: dict[str, Any]) -> None:
    """Greedy or sampled, as SGLang 0.5.23's sampling_params.py decides: temperature defaults to
    1.0; a temperature below 1e-6 means top_k = 1 (greedy)."""
    temperature = params.get("temperature")
    temperature = 1.0 if temperature is None else temperature
    try:
        temperature = float(temperature)
    except (TypeError, ValueError):
        raise RequestError(400, f"temperature must be a number, got {temperature!r}.") from None
    if not math.isfinite(temperature) or temperature < 0.0:
        raise RequestError(
            400, f"temperature must be a non-negative finite number, got {temperature}.")
    top_k = params.get("top_k")
    req.greedy = temperature < 1e-6 or top_k == 1
    seed = params.get("sampling_seed")
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise RequestError(
                400, f"sampling_seed must be an integer, got {type(seed).__name__}.")
        req.sampling_seed = seed


def _int_param(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError(400, f"{key} must be an integer, got {value!r}.")
    return value


def _logprob_params(req: SimRequest, body: dict[str, Any]) -> None:
    """GenerateReqInput's logprob fields (io_struct.py): return_logprob (default False),
    logprob_start_len (default -1: output tokens only), top_logprobs_num (default 0);
    scheduler.py ignores logprob_start_len without return_logprob."""
    req.return_logprob = bool(body.get("return_logprob"))
    req.top_logprobs_num = max(0, _int_param(body, "top_logprobs_num", 0))
    req.logprob_start_len = _int_param(body, "logprob_start_len", -1)
    if not req.return_logprob:
        req.logprob_start_len = -1


def _with_logprobs(meta: dict[str, Any], req: SimRequest, ev: Event, token_rows: list,
                   top_rows: list, cut: int, text: bool) -> dict[str, Any]:
    """meta_info with the logprob keys, in the order SGLang 0.5.23 puts them
    (tokenizer_manager.py _handle_batch_output -> add_logprob_to_meta_info: after
    num_retractions, before reasoning_tokens). input_token_logprobs is sent whole in every
    chunk; the output_* lists are cumulative, or only the new rows with
    --incremental-streaming-output (_slice_streaming_output_meta_info);
    output_token_logprobs_length counts all rows so far."""
    inputs = ev.meta["input_logprobs"] or {"token": [], "top": []}

    def rows(items: list) -> list:
        return [[v, i, t if text else None] for v, i, t in items]

    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key == "reasoning_tokens":
            out["input_token_logprobs"] = rows(inputs["token"])
            out["output_token_logprobs"] = [list(r) for r in token_rows[cut:]]
            out["output_token_logprobs_length"] = len(token_rows)
            if req.top_logprobs_num > 0:
                out["input_top_logprobs"] = [None if r is None else rows(r)
                                             for r in inputs["top"]]
                out["output_top_logprobs"] = [list(r) for r in top_rows[cut:]]
        out[key] = value
    return out


def _finish_reason(count: int) -> dict[str, Any]:
    return {"type": "length", "length": count}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sglang-sim"
    # Small SSE chunks must not wait for the client's delayed ACK (uvicorn sets TCP_NODELAY too).
    disable_nagle_algorithm = True
    state: SimState  # set on the subclass built by make_server

    # ------------------------------------------------------------ plumbing
    def log_message(self, format: str, *args: Any) -> None:
        status = args[1] if len(args) > 1 else ""
        self.state.log(f'{self.client_address[0]} "{self.requestline}" {status}', level="debug")

    def _send(self, status: int, body: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload, separators=(",", ":")).encode())

    def _text(self, status: int, text: str) -> None:
        self._send(status, text.encode(), "text/plain; charset=utf-8")

    def _raw(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _body(self, raw: bytes | None = None) -> Any:
        raw = self._raw() if raw is None else raw
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as err:
            raise RequestError(400, f"Invalid JSON body: {err}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "The request body must be a JSON object.")
        return body

    def _body_with_ids(self, key: str) -> tuple[Any, bytes | None]:
        """Parse a JSON body whose ``key`` may hold a long flat list of token ids, cutting the
        list out as canonical bytes instead of building one Python int per id."""
        raw = self._raw()
        marker = f'"{key}"'.encode()
        at = raw.find(marker)
        if at >= 0:
            pos = at + len(marker)
            while pos < len(raw) and raw[pos] in b" \t\r\n:":
                pos += 1
            if pos < len(raw) and raw[pos:pos + 1] == b"[":
                close = raw.find(b"]", pos)
                inner = raw[pos + 1:close] if close > 0 else b""
                if close > 0 and b"[" not in inner and b'"' not in inner:
                    rest = raw[:pos] + b"null" + raw[close + 1:]
                    body = self._body(rest)
                    try:
                        return body, ids_segment_to_canonical(inner)
                    except IdsFormatError as err:
                        raise RequestError(400, self._ids_error(err)) from None
        return self._body(raw), None

    def _ids_error(self, err: IdsFormatError) -> str:
        if isinstance(err, OutOfVocabError):
            return out_of_vocab_message(err.token_id, self.state.model.vocab_size)
        return str(err)

    def _authorized(self, path: str) -> bool:
        key = self.state.values.get("api_key")
        if not key or path.startswith(OPEN_PATHS) or self.command == "OPTIONS":
            return True
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and token == key

    # ------------------------------------------------------------ dispatch
    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        # Arrival: the request line and headers are in, the body is not read yet. The engine's
        # modelled time runs from here (see engine.modelled_wait).
        self._arrived = time.monotonic()
        self._t0 = time.perf_counter()
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        try:
            if not self._authorized(path):
                self._body()
                self._json(401, {"error": "Unauthorized"})
                return
            route = ROUTES.get((self.command, path))
            if route is None and path.startswith("/v1/models/") and self.command == "GET":
                route = Handler.h_model_card
            if route is None:
                self._body()
                known = any(p == path for (_, p) in ROUTES)
                if known:
                    self._json(405, {"detail": "Method Not Allowed"})
                else:
                    self._json(404, {"detail": "Not Found"})
                return
            route(self, url)
        except RequestError as err:
            self._json(err.status, {"error": {"message": str(err)}})
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    # ------------------------------------------------------------ health
    def h_health(self, url) -> None:
        st = self.state
        if st.status != "up" or "never_healthy" in st.settings.faults:
            self._send(503, b"")
            return
        self._send(200, b"")

    def h_ready(self, url) -> None:
        self.h_health(url)

    # ------------------------------------------------------------ info
    def h_server_info(self, url) -> None:
        self._json(200, self.state.server_info())

    def h_model_info(self, url) -> None:
        self._json(200, self.state.model_info())

    def h_models(self, url) -> None:
        self._json(200, {"object": "list", "data": [self.state.model_card(
            self.state.served_model_name)]})

    def h_model_card(self, url) -> None:
        name = urlsplit(self.path).path[len("/v1/models/"):]
        if name != self.state.served_model_name:
            self._json(404, {"error": {"message": f"The model '{name}' does not exist",
                                       "type": "invalid_request_error", "param": "model",
                                       "code": "model_not_found"}})
            return
        self._json(200, self.state.model_card(name))

    def h_metrics(self, url) -> None:
        if not self.state.values.get("enable_metrics"):
            self._json(404, {"detail": "Not Found"})
            return
        self._send(200, self.state.metrics_text().encode(),
                   "text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------ cache
    def h_flush_cache(self, url) -> None:
        self._body()
        query = parse_qs(url.query)
        try:
            timeout = float(query.get("timeout", ["0"])[0])
            if timeout < 0:
                raise ValueError
        except ValueError:
            self._json(422, {"detail": [{"type": "greater_than_equal", "loc": ["query", "timeout"],
                                         "msg": "Input should be greater than or equal to 0"}]})
            return
        ok, message = self.state.engine.flush(timeout)
        if ok:
            self._text(200, "Cache flushed.\nPlease check backend logs for more details. "
                            "(When there are running or waiting requests, the operation will "
                            "not be performed.)\n")
        else:
            self._text(400, message or "Flush cache failed.\n")

    def h_clear_storage(self, url) -> None:
        """POST /hicache/storage-backend/clear (scheduler.clear_hicache_storage_wrapped: 200 when
        HiCache is on, the L3 files removed if a backend is attached; else 400)."""
        self._body()
        engine = self.state.engine
        ok = engine.hicache and (engine.storage is None or engine.storage.clear())
        self._text(200 if ok else 400, "Hierarchical cache storage backend cleared.\n")

    # ------------------------------------------------------------ tokenize
    def h_tokenize(self, url) -> None:
        body = self._body()
        vocab = self.state.model.vocab_size
        prompt = body.get("prompt")
        if body.get("messages"):
            prompt = render_chat(body["messages"])
        if isinstance(prompt, list):
            tokens: Any = [list(tokenize(p, vocab)) for p in prompt]
            count: Any = [len(t) for t in tokens]
        else:
            tokens = list(tokenize(prompt or "", vocab))
            count = len(tokens)
        self._json(200, {"tokens": tokens, "count": count,
                         "max_model_len": self.state.engine.context_len})

    # ------------------------------------------------------------ generation
    def _tokens_from(self, text: Any, ids: Any) -> bytes:
        vocab = self.state.model.vocab_size
        if ids is not None:
            if not isinstance(ids, list) or (ids and isinstance(ids[0], list)):
                raise RequestError(400, "The simulator serves one prompt per request "
                                        "(batched input_ids are not supported).")
            try:
                return canonical(ids)
            except IdsFormatError as err:
                raise RequestError(400, self._ids_error(err)) from None
        if isinstance(text, str):
            return canonical(tokenize(text, vocab))
        if text is None:
            raise RequestError(400, "Either text or input_ids should be provided.")
        raise RequestError(400, "The simulator serves one prompt per request "
                                "(batched text is not supported).")

    def _check_up(self) -> None:
        if self.state.status != "up":
            raise RequestError(503, "The server is not ready yet (model still loading).")

    def h_generate(self, url) -> None:
        body, fast_ids = self._body_with_ids("input_ids")
        self._check_up()
        params = body.get("sampling_params") or {}
        max_new = params.get("max_new_tokens", 128)
        max_new = 128 if max_new is None else int(max_new)
        tokens = fast_ids if fast_ids is not None else self._tokens_from(
            body.get("text"), body.get("input_ids"))
        req = SimRequest(tokens=tokens, max_new_tokens=max_new, stream=bool(body.get("stream")),
                         log_metrics=body.get("log_metrics", True) is not False,
                         arrived=self._arrived)
        _sampling(req, params)
        _logprob_params(req, body)
        text_in_logprobs = bool(body.get("return_text_in_logprobs"))
        if body.get("rid"):
            req.rid = str(body["rid"])
        incremental = bool(self.state.values.get("incremental_streaming_output"))
        events = self.state.engine.run(req)
        started = self._arrived
        # Output logprob rows so far: [logprob, token_id, text or None] (tokenizer_manager.py
        # detokenize_logprob_tokens; JSON turns its tuples into lists).
        token_rows: list[list[Any]] = []
        top_rows: list[Any] = []
        sent = 0  # rows already sent (incremental streaming sends only the new ones)

        def payload(ev: Event, text: str, ids: list[int]) -> dict[str, Any]:
            nonlocal sent
            meta = self._meta(req, ev, started)
            if req.return_logprob:
                if ev.index >= 0:
                    piece = ev.piece if text_in_logprobs else None
                    token_rows.append([ev.logprob, ev.token_id, piece])
                    if ev.top is not None:
                        top_rows.append([[lp, tid, output_piece(tid) if text_in_logprobs
                                          else None] for lp, tid in ev.top])
                cut = sent if req.stream and incremental else 0
                sent = len(token_rows)
                meta = _with_logprobs(meta, req, ev, token_rows, top_rows, cut,
                                      text_in_logprobs)
            return {"text": text, "output_ids": ids, "meta_info": meta}

        if not req.stream:
            pieces: list[str] = []
            ids: list[int] = []
            last = None
            for ev in events:
                if ev.index >= 0:
                    pieces.append(ev.piece)
                    ids.append(ev.token_id)
                    if req.return_logprob and not ev.finished:
                        payload(ev, "", [])  # collect the logprob rows
                last = ev
            self._json(200, payload(last, "".join(pieces), ids))
            return
        first = self._first_event(events)
        self._start_stream()
        pieces, ids = [], []
        try:
            for ev in _chain(first, events):
                if ev.index >= 0:
                    pieces.append(ev.piece)
                    ids.append(ev.token_id)
                if incremental:
                    chunk = payload(ev, ev.piece, [ev.token_id] if ev.index >= 0 else [])
                else:
                    chunk = payload(ev, "".join(pieces), list(ids))
                self._chunk(b"data: " + json.dumps(chunk, separators=(",", ":")).encode()
                            + b"\n\n")
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except ConnectionAbortedError:
            self._cut()
        finally:
            events.close()

    def _meta(self, req: SimRequest, ev: Event, started: float) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": _finish_reason(ev.meta["completion_tokens"]) if ev.finished else None,
            "prompt_tokens": ev.meta["prompt_tokens"],
            "weight_version": self.state.values.get("weight_version") or "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": ev.meta["completion_tokens"],
            "cached_tokens": ev.meta["cached_tokens"],
        }
        if ev.meta["details"] is not None:
            meta["cached_tokens_details"] = dict(ev.meta["details"])
        if ev.finished:
            meta["e2e_latency"] = time.monotonic() - started
        # server_s: from the handler's start (request read, JSON parsed, ids hashed, ...) to this
        # output; at SGLANG_SIM_TIME_SCALE=0 it is the simulator's own overhead.
        meta["sglang_sim"] = dict(ev.meta["sim"], ttft_s=ev.meta["ttft"],
                                  server_s=time.perf_counter() - self._t0)
        return meta

    def _first_event(self, events):
        """Run up to the first token before committing to a 200 stream, so errors and the
        generate_500 fault come back as plain HTTP errors, as in SGLang's non-stream path."""
        try:
            return next(events)
        except StopIteration:
            raise RequestError(500, "no output") from None

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _cut(self) -> None:
        """The cut_stream fault: drop the connection mid-stream, without the final chunk."""
        self.state.log("SIMULATOR fault cut_stream: closing the stream mid-way", level="warning")
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(2)
        except OSError:
            pass

    # ------------------------------------------------------------ OpenAI
    def h_completions(self, url) -> None:
        self._openai(chat=False)

    def h_chat(self, url) -> None:
        self._openai(chat=True)

    def _openai(self, chat: bool) -> None:
        body, fast_ids = self._body_with_ids("prompt") if not chat else (self._body(), None)
        self._check_up()
        st = self.state
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RequestError(400, "messages must be a non-empty list")
            tokens = canonical(tokenize(render_chat(messages), st.model.vocab_size))
            max_new = body.get("max_completion_tokens") or body.get("max_tokens")
            max_new = 128 if max_new is None else int(max_new)
        else:
            prompt = body.get("prompt")
            if fast_ids is not None:
                tokens = fast_ids
            elif isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
                tokens = self._tokens_from(None, prompt)
            elif isinstance(prompt, list) and len(prompt) == 1:
                tokens = self._tokens_from(prompt[0] if isinstance(prompt[0], str) else None,
                                           prompt[0] if isinstance(prompt[0], list) else None)
            else:
                tokens = self._tokens_from(prompt, None)
            max_new = int(body.get("max_tokens", 16) if body.get("max_tokens") is not None else 16)
        stream = bool(body.get("stream"))
        req = SimRequest(tokens=tokens, max_new_tokens=max_new, stream=stream,
                         arrived=self._arrived)
        _sampling(req, body)  # temperature / top_k at the top level (OpenAI protocol)
        model = body.get("model") or "default"
        created = int(time.time())
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        req.rid = rid
        cache_report = bool(st.values.get("enable_cache_report"))
        want_details = bool(body.get("return_cached_tokens_details"))
        obj = "chat.completion" if chat else "text_completion"
        events = st.engine.run(req)

        def usage(ev: Event, drop_none: bool) -> dict[str, Any]:
            prompt_tokens = ev.meta["prompt_tokens"]
            completion = ev.meta["completion_tokens"]
            data: dict[str, Any] = {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion,
                "completion_tokens": completion,
                "prompt_tokens_details": ({"cached_tokens": ev.meta["cached_tokens"]}
                                          if cache_report else None),
                "reasoning_tokens": 0,
                "completion_tokens_details": None,
            }
            return {k: v for k, v in data.items() if v is not None} if drop_none else data

        def sglext(ev: Event) -> dict[str, Any] | None:
            if want_details and ev.meta["details"] is not None:
                return {"cached_tokens_details": dict(ev.meta["details"])}
            return None

        if not stream:
            text, last = [], None
            for ev in events:
                if ev.index >= 0:
                    text.append(ev.piece)
                last = ev
            finish = "length"
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": "".join(text),
                                                  "reasoning_content": None},
                          "logprobs": None, "finish_reason": finish, "matched_stop": None}
            else:
                choice = {"index": 0, "text": "".join(text), "logprobs": None,
                          "finish_reason": finish, "matched_stop": None}
            resp: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model,
                                    "choices": [choice], "usage": usage(last, False),
                                    "metadata": None}
            ext = sglext(last)
            if ext:
                resp["sglext"] = ext
            self._json(200, resp)
            return

        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        first = self._first_event(events)
        self._start_stream()

        def emit(payload: dict[str, Any]) -> None:
            self._chunk(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")

        def frame(choices: list[dict[str, Any]]) -> dict[str, Any]:
            return {"id": rid, "object": chunk_obj, "created": created, "model": model,
                    "choices": choices, "usage": None}

        try:
            last = None
            if chat:
                emit(frame([{"index": 0, "delta": {"role": "assistant", "content": "",
                                                   "reasoning_content": None},
                             "logprobs": None, "finish_reason": None, "matched_stop": None}]))
            for ev in _chain(first, events):
                last = ev
                finish = "length" if ev.finished else None
                piece = ev.piece if ev.index >= 0 else ""
                if chat:
                    choice = {"index": 0, "delta": {"role": None, "content": piece,
                                                    "reasoning_content": None},
                              "logprobs": None, "finish_reason": finish, "matched_stop": None}
                else:
                    choice = {"index": 0, "text": piece, "logprobs": None,
                              "finish_reason": finish, "matched_stop": None}
                emit(frame([choice]))
            ext = sglext(last)
            if ext:
                emit(dict(frame([]), sglext=ext))
            if include_usage:
                final = frame([])
                final.pop("usage")
                final["usage"] = usage(last, True)
                emit(final)
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except ConnectionAbortedError:
            self._cut()
        finally:
            events.close()


def _chain(first, rest):
    yield first
    yield from rest


ROUTES: dict[tuple[str, str], Any] = {}
for _method, _path, _fn in [
    ("GET", "/health", Handler.h_health),
    ("GET", "/health_generate", Handler.h_health),
    ("GET", "/ready", Handler.h_ready),
    ("GET", "/get_server_info", Handler.h_server_info),
    ("GET", "/server_info", Handler.h_server_info),
    ("GET", "/get_model_info", Handler.h_model_info),
    ("GET", "/model_info", Handler.h_model_info),
    ("GET", "/v1/models", Handler.h_models),
    ("GET", "/metrics", Handler.h_metrics),
    ("GET", "/flush_cache", Handler.h_flush_cache),
    ("POST", "/flush_cache", Handler.h_flush_cache),
    ("POST", "/hicache/storage-backend/clear", Handler.h_clear_storage),
    ("POST", "/generate", Handler.h_generate),
    ("PUT", "/generate", Handler.h_generate),
    ("POST", "/v1/completions", Handler.h_completions),
    ("POST", "/v1/chat/completions", Handler.h_chat),
    ("POST", "/tokenize", Handler.h_tokenize),
    ("POST", "/v1/tokenize", Handler.h_tokenize),
]:
    ROUTES[(_method, _path)] = _fn


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def make_server(state: SimState, host: str, port: int) -> SimHTTPServer:
    handler = type("SimHandler", (Handler,), {"state": state})
    return SimHTTPServer((host, port), handler)


def serve_in_thread(server: SimHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name="sglang-sim-http", daemon=True)
    thread.start()
    return thread

