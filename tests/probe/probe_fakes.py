"""Small stdlib HTTP servers that play an SGLang server and its faults, for the probe's tests.

The fake keeps a toy radix cache: a prompt seen before is a device hit while it is in the device pool
(LRU, `capacity` tokens), a host hit after eviction when HiCache is on, a miss otherwise. Prefill
sleeps `s_per_token` per uncached token, so a warm hit answers sooner than a cold miss.
"""

from __future__ import annotations

import collections
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeState:
    def __init__(
        self,
        faults: tuple[str, ...] = (),
        capacity: int = 4096,
        page_size: int = 1,
        hicache: bool = True,
        cache_report: bool = True,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        s_per_token: float = 0.0002,
        busy_flushes: int = 0,
        error_body: str = "Internal Server Error: HIP out of memory while allocating the KV pool",
        logprobs: bool = False,
        warm_diverge_at: int | None = None,
        warm_logprob_shift: float = 0.0,
        incremental: bool = False,
        storage_backend: str | None = None,
        storage: set | None = None,
        storage_hits: bool = True,
    ) -> None:
        self.faults = set(faults)
        self.capacity = capacity
        self.page_size = page_size
        self.hicache = hicache
        self.cache_report = cache_report
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.s_per_token = s_per_token
        self.busy_flushes = busy_flushes
        self.error_body = error_body
        # The answer (faults "no_output_ids"): ids from the prompt's last ids, the same for the same
        # prompt, like a greedy model's. logprobs: meta_info.output_token_logprobs as SGLang 0.5.23
        # ([logprob, id, None]) when the request asks return_logprob. A read of a cached prompt answers
        # another id from warm_diverge_at on, or logprobs shifted by warm_logprob_shift.
        # incremental: stream only the new ids (--incremental-streaming-output).
        self.logprobs = logprobs
        self.warm_diverge_at = warm_diverge_at
        self.warm_logprob_shift = warm_logprob_shift
        self.incremental = incremental
        self.requests: list[tuple[str, str]] = []
        self.generate_bodies: list[dict] = []
        self.device: collections.OrderedDict[tuple, int] = collections.OrderedDict()
        self.host: set[tuple] = set()
        # The L3 tier (--hicache-storage-backend): every prompt is written through to it; /flush_cache
        # leaves it, as SGLang 0.5.23 does. Pass the same set to a second FakeServer to play a restart
        # that keeps the storage directory. storage_hits False: it never gives a prompt back (lost pages).
        self.storage_backend = storage_backend
        self.storage: set[tuple] = storage if storage is not None else set()
        self.storage_hits = storage_hits
        self.lock = threading.Lock()

    def server_info(self) -> dict:
        info: dict[str, Any] = {
            "version": "0.5.23-fake",
            "model_path": "/nonexistent/fake-model",
            "page_size": self.page_size,
            "max_total_num_tokens": self.capacity,
            "max_req_input_len": 131072,
            "context_length": 131072,
            "enable_hierarchical_cache": self.hicache,
            "enable_cache_report": self.cache_report,
            "internal_states": [{"memory_usage": {"token_capacity": self.capacity}}],
        }
        if self.hicache:
            info.update(hicache_size=12, hicache_ratio=2.0, hicache_io_backend="kernel",
                        hicache_write_policy="write_through", hicache_mem_layout="page_first")
        info["hicache_storage_backend"] = self.storage_backend
        return info

    def lookup(self, key: tuple, n: int) -> tuple[int, int, int]:
        """(device, host, storage) cached tokens of a prompt, then insert it (LRU) and evict over capacity."""
        with self.lock:
            cacheable = (max(n - 1, 0) // self.page_size) * self.page_size
            device = host = storage = 0
            if key in self.device:
                device = cacheable
                self.device.move_to_end(key)
            elif key in self.host:
                host = cacheable
            elif self.storage_backend and self.storage_hits and key in self.storage:
                storage = cacheable
            if self.storage_backend:
                self.storage.add(key)
            self.device[key] = n
            while sum(self.device.values()) > self.capacity and len(self.device) > 1:
                old, _ = self.device.popitem(last=False)
                if self.hicache:
                    self.host.add(old)
            return device, host, storage


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: FakeState  # set per server class

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, obj: Any, status: int = 200) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _authorized(self) -> bool:
        key = self.state.api_key
        # Like SGLang's --admin-api-key: admin endpoints then take that key only.
        if self.state.admin_api_key is not None and self.path.split("?")[0] == "/flush_cache":
            key = self.state.admin_api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._json({"error": "Unauthorized"}, 401)
        return False

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def do_GET(self) -> None:
        self.state.requests.append(("GET", self.path))
        if not self._authorized():
            return
        path = self.path.split("?")[0]
        if path in ("/health", "/health_generate"):
            self._send(503 if "never_healthy" in self.state.faults else 200, b"")
        elif path in ("/get_server_info", "/server_info"):
            self._json(self.state.server_info())
        elif path in ("/get_model_info", "/model_info"):
            self._json({"model_path": "/nonexistent/fake-model", "served_model_name": "fake",
                        "is_generation": True})
        else:
            self._send(404, b'{"detail":"Not Found"}', "application/json")

    def do_POST(self) -> None:
        self.state.requests.append(("POST", self.path))
        body = self._body()
        if not self._authorized():
            return
        path = self.path.split("?")[0]
        if path == "/flush_cache":
            if "flush_busy" in self.state.faults or self.state.busy_flushes > 0:
                self.state.busy_flushes -= 1
                self._send(400, b"Flush cache failed.\n")
                return
            with self.state.lock:
                self.state.device.clear()
                self.state.host.clear()
            self._send(200, b"Cache flushed.\nPlease check backend logs for more details.\n")
        elif path == "/generate":
            self._generate(json.loads(body))
        else:
            self._send(404, b'{"detail":"Not Found"}', "application/json")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _generate(self, req: dict) -> None:
        st = self.state
        st.generate_bodies.append({"n": len(req.get("input_ids") or []),
                                   "sampling_params": req.get("sampling_params"),
                                   "stream": req.get("stream"),
                                   "return_logprob": req.get("return_logprob"),
                                   "logprob_start_len": req.get("logprob_start_len"),
                                   "head": list((req.get("input_ids") or [])[:1024])})
        if "gen_500" in st.faults:
            self._send(500, st.error_body.encode())
            return
        ids = req["input_ids"]
        n = len(ids)
        out = int(req["sampling_params"]["max_new_tokens"])
        device, host, storage = st.lookup(tuple(ids), n)
        cached = device + host + storage
        time.sleep(st.s_per_token * (n - cached) + st.s_per_token * host / 50.0 + st.s_per_token * storage / 20.0)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = sum(ids[-64:])
        answer = [(base + 31 * i) % 1000 for i in range(out)]
        logprobs = [-0.01 * (i + 1) for i in range(out)]
        if cached and st.warm_diverge_at is not None and st.warm_diverge_at < out:
            answer[st.warm_diverge_at] = (answer[st.warm_diverge_at] + 1) % 1000
        if cached:
            logprobs = [lp - st.warm_logprob_shift for lp in logprobs]
        for i in range(out):
            meta: dict[str, Any] = {
                "id": "fake", "prompt_tokens": n, "completion_tokens": i + 1,
                "finish_reason": {"type": "length", "length": out} if i == out - 1 else None,
                "e2e_latency": 0.0,
            }
            if "no_accounting" not in st.faults:
                meta["cached_tokens"] = cached
                meta["cached_tokens_details"] = {"device": device, "host": host} if cached else None
                if cached and st.storage_backend:
                    meta["cached_tokens_details"].update(storage=storage, storage_backend=st.storage_backend)
            first = i if st.incremental else 0
            if st.logprobs and req.get("return_logprob"):
                meta["output_token_logprobs"] = [[lp, t, None] for lp, t in
                                                 zip(logprobs[first:i + 1], answer[first:i + 1], strict=True)]
            event = {"text": "tok " * (i + 1), "output_ids": answer[first:i + 1], "meta_info": meta}
            if "no_output_ids" in st.faults:
                del event["output_ids"]
            if "gen_cut" in st.faults and i == 1:
                # half an event, then the connection dies (no terminating chunk)
                self.wfile.write(b"40\r\ndata: {\"text\": \"tok")
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")


class FakeServer:
    """A fake SGLang on 127.0.0.1 in a thread; use as a context manager."""

    def __init__(self, **kwargs: Any) -> None:
        self.state = FakeState(**kwargs)
        handler = type("BoundHandler", (Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    @property
    def requests(self) -> list[tuple[str, str]]:
        return self.state.requests
