"""Hostile or broken servers on 127.0.0.1, one behaviour each, for the clients' tests (issue 24).

Each fake answers the health and info endpoints like SGLang (probe_fakes.FakeServer) except for the
one thing it does wrong. Every loop a fake runs is bounded (it ends when the client goes away or after
DRIP_MAX_S), and the server is stopped by shutdown when its `with` block ends, also on failure.

- ``huge``: GET /get_server_info announces and sends 64 MiB.
- ``huge_event``: POST /generate streams one SSE line of 16 MiB without a line break.
- ``drip``: GET /get_server_info sends one byte every DRIP_EVERY_S, without end.
- ``drip_stream``: POST /generate sends one byte of a never-ending line every DRIP_EVERY_S.
- ``drip_head``: every request gets a status line, then a header that never ends, a byte at a time.
- ``redirect``: every request answers 307 to ``redirect_to`` (a Recorder).
- ``sizes``: /generate reports the token counts in ``meta`` (absurd ones), /get_server_info ``info``.
- ``evil_error``: /generate answers 500 with control characters and Markdown in its body.
- ``evil_names``: /get_model_info names the model with control characters and Markdown.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DRIP_EVERY_S = 0.2
DRIP_MAX_S = 90.0
EVIL_TEXT = "boom\r\x1b[2J\x1b]0;pwned\x07 | cell | **bold** [link](http://evil.example/) <b>x</b>\n# heading\u202e"


class _Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hostile"
    fake: HostileServer

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class _Hostile(_Base):
    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        self._answer("POST")

    def _answer(self, method: str) -> None:
        fake = self.fake
        path = self.path.split("?")[0]
        fake.seen.append((method, path, self.headers.get("Authorization")))
        b = fake.behaviour
        if b == "redirect":
            self._send(307, b"", Location=fake.redirect_to + self.path)
        elif b == "drip_head":
            self.close_connection = True
            self._drip(prefix=b"HTTP/1.1 200 OK\r\nX-Slow: ")
        elif path in ("/health", "/health_generate"):
            self._send(200, b"")
        elif path in ("/get_server_info", "/server_info"):
            if b == "huge":
                self._stream_bytes(64 << 20, length=True)
            elif b == "drip":
                self._drip(length=1000)
            else:
                info = {"version": "0.5.23-fake", "page_size": 1, "max_total_num_tokens": 4096,
                        "max_req_input_len": 131072, "enable_cache_report": True}
                info.update(fake.info)
                self._send(200, json.dumps(info).encode())
        elif path in ("/get_model_info", "/model_info"):
            name = EVIL_TEXT if b == "evil_names" else "fake"
            self._send(200, json.dumps({"model_path": name, "served_model_name": name}).encode())
        elif path == "/flush_cache":
            self._send(200, b"Cache flushed.\n", "text/plain")
        elif path == "/generate":
            self._generate()
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def _generate(self) -> None:
        b = self.fake.behaviour
        if b == "evil_error":
            self._send(500, EVIL_TEXT.encode(), "text/plain")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if b == "huge_event":
            self._stream_bytes(16 << 20, prefix=b"data: ")
        elif b == "drip_stream":
            self._drip(prefix=b"data: ")
        else:
            meta = {"prompt_tokens": 512, "completion_tokens": 1, "finish_reason": {"type": "length"},
                    "cached_tokens": 0}
            meta.update(self.fake.meta)
            event = {"text": "tok", "output_ids": [7], "meta_info": meta}
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n")

    def _stream_bytes(self, total: int, length: bool = False, prefix: bytes = b"") -> None:
        """total bytes of 'x' (after prefix), in 64 KiB writes, until the client stops reading."""
        if length:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(total + len(prefix)))
            self.end_headers()
        block = b"x" * (64 << 10)
        try:
            self.wfile.write(prefix)
            for _ in range(total // len(block)):
                self.wfile.write(block)
        except OSError:
            self.fake.client_gone.set()

    def _drip(self, length: int | None = None, prefix: bytes = b"") -> None:
        """One byte every DRIP_EVERY_S, never a line break, for at most DRIP_MAX_S."""
        if length is not None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(length))
            self.end_headers()
        end = time.monotonic() + DRIP_MAX_S
        try:
            self.wfile.write(prefix)
            self.wfile.flush()
            while time.monotonic() < end and not self.fake.stopping.is_set():
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(DRIP_EVERY_S)
        except OSError:
            self.fake.client_gone.set()


class _Recording(_Base):
    def do_GET(self) -> None:
        self.fake.seen.append(("GET", self.path, self.headers.get("Authorization")))
        self._send(200, b"")

    do_POST = do_GET


class HostileServer:
    """One hostile behaviour on 127.0.0.1 in a thread; use as a context manager."""

    handler: type[_Base] = _Hostile

    def __init__(self, behaviour: str = "", redirect_to: str = "", meta: dict | None = None,
                 info: dict | None = None) -> None:
        self.behaviour = behaviour
        self.redirect_to = redirect_to
        self.meta = meta or {}
        self.info = info or {}
        self.seen: list[tuple[str, str, str | None]] = []
        self.stopping = threading.Event()
        self.client_gone = threading.Event()
        handler = type("Bound", (self.handler,), {"fake": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


class Recorder(HostileServer):
    """The second listener a redirect points to: answers 200 to anything and records what arrived
    (method, path, Authorization header)."""

    handler = _Recording
