"""module_utils/fleet_router.py against the real sglang-router (requirements/router.txt, the venv
molecule prepares in .cache/sglang-router-venv; skipped without it) on 127.0.0.1, in front of a
small fake SGLang worker: in, in again (no change), out until gone, a wrong key. The router is
started here and stopped by its PID."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible.module_utils.fleet_router import ARGUMENT_SPEC, RouterError, check_params, run
from procs import free_port, stop_by_pid

REPO = Path(__file__).resolve().parents[2]
ROUTER_PYTHON = REPO / ".cache" / "sglang-router-venv" / "bin" / "python"
KEY = "real-Router-Key-3x"

pytestmark = [pytest.mark.shared_state, pytest.mark.skipif(not ROUTER_PYTHON.exists(),
                                reason="no sglang-router venv in .cache (molecule prepares it)")]


class Worker:
    """What the router asks a worker when it adds it and health-checks it."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                info = {"model_path": "fixture", "tp_size": 1, "dp_size": 1, "is_generation": True}
                body = json.dumps(info).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def real_router(tmp_path):
    port = free_port()
    log = (tmp_path / "router.log").open("w")
    proc = subprocess.Popen(
        [str(ROUTER_PYTHON), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--policy", "cache_aware",
         "--health-check-interval-secs", "1", "--log-level", "warn",
         "--control-plane-api-keys", f"hicache-fleet:hicache-fleet:admin:{KEY}"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                run(params(url, state="read", timeout=2))
                break
            except RouterError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"sglang-router did not answer: {(tmp_path / 'router.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield url
    finally:
        stop_by_pid(proc)
        log.close()


def params(url: str, **over) -> dict:
    p = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    p.update(url=url, api_key=KEY, worker_host="127.0.0.1", wait_s=30, drain_grace_s=0, poll_interval=0.5,
             timeout=10.0)
    p.update(over)
    assert check_params(p) == []
    return p


def test_in_out_and_a_wrong_key_against_the_real_router(real_router):
    worker = Worker()
    try:
        ports = {"main": worker.port}
        url = f"http://127.0.0.1:{worker.port}"
        joined = run(params(real_router, state="in", ports=ports))
        assert joined["changed"] is True
        assert joined["events"] == [f"joined {url}"]
        again = run(params(real_router, state="in", ports=ports))
        assert again["changed"] is False
        listed = [w for w in again["workers"] if w["url"] == url]
        assert len(listed) == 1
        assert listed[0]["is_healthy"] is True
        assert listed[0]["id"]
        left = run(params(real_router, state="out", ports=ports, names=["main"]))
        assert left["removed"] == ["main"]
        assert left["events"] == [f"left {url}"]
        assert url not in [w["url"] for w in run(params(real_router, state="read"))["workers"]]
        with pytest.raises(RouterError, match=r"did not list its workers .*HTTP 401 \(Invalid authentication token\)"):
            run(params(real_router, state="read", api_key="not-the-key"))
    finally:
        worker.stop()
