"""roles/first_host/files/first_host_server.py, the host-side half of layer 5 (standard library only):
the port check against a real listening socket, the bounded health wait against a real HTTP server
(unit state read through systemctl, replaced here by what systemctl would print)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from typing import ClassVar

import pytest
from plugins import load

server_script = load("roles/first_host/files/first_host_server.py")


def test_port_free_and_taken():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        taken = server_script.port_free("127.0.0.1", port)
    assert taken["free"] is False
    assert f"127.0.0.1:{port}" in taken["detail"]
    assert server_script.port_free("127.0.0.1", port)["free"] is True


class Health(http.server.BaseHTTPRequestHandler):
    answers: ClassVar[list[int]] = []

    def do_GET(self):
        status = self.answers.pop(0) if self.answers else 200
        self.send_response(status)
        self.end_headers()

    def log_message(self, *_args):
        pass


@pytest.fixture
def health():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/health_generate"
    httpd.shutdown()
    httpd.server_close()


ACTIVE = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running"}


def test_wait_until_healthy(health, monkeypatch):
    Health.answers = [503, 503]
    monkeypatch.setattr(server_script, "unit_state", lambda unit: ACTIVE)
    result = server_script.wait("first-host-smoke.service", health, timeout=10, interval=0.01)
    assert result["healthy"] is True
    assert result["polls"] == 3
    assert result["last_status"] == 200


def test_wait_gives_up_when_the_unit_ends(health, monkeypatch):
    Health.answers = [503] * 100
    states = iter([ACTIVE, {"LoadState": "not-found", "ActiveState": "inactive", "Result": "success"}])
    monkeypatch.setattr(server_script, "unit_state", lambda unit: next(states))
    result = server_script.wait("first-host-smoke.service", health, timeout=600, interval=0.01)
    assert result["healthy"] is False
    assert result["ended"] is True
    assert result["polls"] == 2
    assert result["state"].startswith("LoadState=not-found ActiveState=inactive")


def test_wait_is_bounded(health, monkeypatch):
    Health.answers = [503] * 1000
    monkeypatch.setattr(server_script, "unit_state", lambda unit: ACTIVE)
    result = server_script.wait("first-host-smoke.service", health, timeout=0.2, interval=0.05)
    assert result["healthy"] is False
    assert result["ended"] is False
    assert result["last_error"] == "HTTP 503"


def test_main_prints_one_json_line(capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert server_script.main(["port-free", "--host", "127.0.0.1", "--port", str(port)]) == 0
    assert json.loads(capsys.readouterr().out)["free"] is True
