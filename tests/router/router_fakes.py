"""A fake sglang-router on 127.0.0.1 (GET/POST /workers, DELETE /workers/{id}) with the faults the
fleet_router module must survive: removals and health that lag, 5xx, redirects, oversized and
dripping answers, hostile ids. Records every request (method, raw path, Authorization, body)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeRouter:
    def __init__(self) -> None:
        self.workers: dict[str, dict] = {}  # id -> {id, url, is_healthy}
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        # GET /workers answers that still list a removed worker, and that list an added one unhealthy
        self.delete_lag = 0
        self.healthy_after = 0
        self._gone_in: dict[str, int] = {}
        self._healthy_in: dict[str, int] = {}
        # faults: the GET /workers answer number n (1-based) and later ones get fault[...] when set
        self.get_fault: str | None = None  # "503", "redirect", "huge", "drip", "control", "not_a_list"
        self.get_fault_from = 1
        self.delete_status = 202
        self.delete_body = b'{"status":"accepted"}'
        self.post_status = 202
        self.next_ids: list[str] = []
        self.redirect_to = ""
        self.gets = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status: int, body: bytes, ctype: str = "application/json", extra: dict | None = None):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def _record(self, body: bytes = b"") -> None:
                with fake.lock:
                    fake.requests.append({"method": self.command, "path": self.path, "body": body,
                                          "authorization": self.headers.get("Authorization")})

            def do_GET(self):
                self._record()
                if self.path != "/workers":
                    return self._send(404, b"{}")
                with fake.lock:
                    fake.gets += 1
                    n = fake.gets
                    fault = fake.get_fault if fake.get_fault and n >= fake.get_fault_from else None
                    listed = []
                    for wid, w in list(fake.workers.items()):
                        if wid in fake._gone_in:
                            if fake._gone_in[wid] <= 0:
                                del fake.workers[wid]
                                del fake._gone_in[wid]
                                continue
                            fake._gone_in[wid] -= 1
                        if wid in fake._healthy_in:
                            if fake._healthy_in[wid] <= 0:
                                w["is_healthy"] = True
                                del fake._healthy_in[wid]
                            else:
                                fake._healthy_in[wid] -= 1
                        listed.append(dict(w))
                if fault == "503":
                    return self._send(503, b"upstream unavailable")
                if fault == "redirect":
                    return self._send(302, b"", extra={"Location": fake.redirect_to + "/workers"})
                if fault == "control":
                    return self._send(500, b"\x1b[31mboom\x1b[0m\r\nFAKE-LOG-LINE " + b"x" * 5000)
                if fault == "not_a_list":
                    return self._send(200, json.dumps({"workers": {"url": "x"}}).encode())
                if fault == "huge":
                    chunk = b'{"workers": [' + b"\x1b[2J" * 10 + b" " * (5 << 20)
                    return self._send(200, chunk)
                if fault == "drip":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    try:
                        for _ in range(600):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(0.05)
                    except OSError:
                        pass
                    self.close_connection = True
                    return None
                return self._send(200, json.dumps({"workers": listed, "total": len(listed)}).encode())

            def do_DELETE(self):
                self._record()
                prefix = "/workers/"
                if not self.path.startswith(prefix):
                    return self._send(404, b"{}")
                import urllib.parse
                wid = urllib.parse.unquote(self.path[len(prefix):])
                with fake.lock:
                    status = fake.delete_status
                    if status in (200, 202, 204) and wid in fake.workers:
                        fake._gone_in[wid] = fake.delete_lag
                return self._send(status, fake.delete_body if status != 204 else b"")

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                self._record(body)
                if self.path != "/workers":
                    return self._send(404, b"{}")
                url = json.loads(body)["url"]
                with fake.lock:
                    status = fake.post_status
                    if status in (200, 201, 202):
                        wid = fake.next_ids.pop(0) if fake.next_ids else str(uuid.uuid4())
                        fake.workers[wid] = {"id": wid, "url": url, "is_healthy": fake.healthy_after == 0}
                        if fake.healthy_after:
                            fake._healthy_in[wid] = fake.healthy_after
                return self._send(status, json.dumps({"status": "accepted"}).encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, url: str, wid: str | None = None, healthy: bool = True) -> str:
        wid = wid or str(uuid.uuid4())
        self.workers[wid] = {"id": wid, "url": url, "is_healthy": healthy}
        return wid

    def listed(self) -> list[str]:
        return sorted(w["url"] for w in self.workers.values())

    def methods(self) -> list[str]:
        return [f"{r['method']} {r['path']}" for r in self.requests]

    def start(self) -> FakeRouter:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


