"""Fixtures of the bake tests: the module_utils importable as Ansible names them, a fake Prometheus."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import ansible.module_utils
import pytest
from plugins import ROOT as REPO

if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))


class FakePrometheus:
    """/api/v1/query answering canned vectors keyed by the exact PromQL text; any other query gets an
    empty vector (as Prometheus answers a selector that matches nothing). Records every request."""

    def __init__(self) -> None:
        self.answers: dict[str, list] = {}
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query).get("query", [""])[0]
                fake.requests.append({"path": url.path, "query": query,
                                      "authorization": self.headers.get("Authorization")})
                if url.path != "/api/v1/query":
                    self.send_response(404)
                    self.end_headers()
                    return
                body = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                                 "result": fake.answers.get(query, [])}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakePrometheus:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def fake_prometheus():
    fake = FakePrometheus().start()
    yield fake
    fake.stop()
