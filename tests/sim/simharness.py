"""Helpers for the SGLang simulator tests: start a simulator process, talk to it, stop it.

Each server runs as a subprocess on 127.0.0.1 with a free port and is stopped by its PID in the
fixture's finalizer (SIGTERM, then SIGKILL), also when the test fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procs import free_port, stop_by_pid

SIM_DIR = Path(__file__).resolve().parents[2] / "sim"
if str(SIM_DIR) not in sys.path:
    sys.path.insert(0, str(SIM_DIR))


BASE_ENV = {
    "SGLANG_SIM_TIME_SCALE": "0.001",
    "SGLANG_SIM_LOAD_DELAY_S": "0.05",
    "SGLANG_SIM_HOST_MEM_GB": "256",
}


@dataclass
class Sim:
    proc: subprocess.Popen
    port: int
    log_path: Path
    api_key: str | None = None
    argv: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(self, method: str, path: str, body: Any = None, headers: dict | None = None,
                timeout: float = 30.0) -> tuple[int, bytes, dict]:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        if self.api_key:
            hdrs["Authorization"] = f"Bearer {self.api_key}"
        hdrs.update(headers or {})
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as err:
            return err.code, err.read(), dict(err.headers)

    def get_json(self, path: str) -> Any:
        status, body, _ = self.request("GET", path)
        assert status == 200, (status, body)
        return json.loads(body)

    def post_json(self, path: str, body: Any) -> Any:
        status, raw, _ = self.request("POST", path, body)
        assert status == 200, (status, raw)
        return json.loads(raw)

    def stop(self) -> int | None:
        return stop_by_pid(self.proc)


def start_sim(tmp_path: Path, model_dir: Path, extra_args: list[str] | None = None,
              env: dict[str, str] | None = None, wait: bool = True) -> Sim:
    port = free_port()
    argv = ["--model-path", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
            *(extra_args or [])]
    log_path = tmp_path / f"sim-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM_")}
    full_env.update(BASE_ENV)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = str(SIM_DIR)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sglang_sim.launch_server", *argv],
                                stdout=log, stderr=subprocess.STDOUT, env=full_env)
    api_key = None
    if "--api-key" in argv:
        api_key = argv[argv.index("--api-key") + 1]
    sim = Sim(proc=proc, port=port, log_path=log_path, api_key=api_key, argv=argv)
    if wait:
        wait_healthy(sim)
    return sim


def wait_healthy(sim: Sim, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sim.proc.poll() is not None:
            raise AssertionError(f"simulator exited {sim.proc.returncode}:\n{sim.log()}")
        try:
            status, _, _ = sim.request("GET", "/health", timeout=2)
            if status == 200:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"simulator not healthy within {timeout}s:\n{sim.log()}")


# A small HiCache server: D = 4096 tokens, host pool = 2 x D (+1 padding page).
SMALL_HICACHE_ARGS = ["--tp-size", "2", "--enable-hierarchical-cache", "--hicache-ratio", "2.0",
                      "--hicache-write-policy", "write_through", "--enable-cache-report",
                      "--enable-metrics", "--served-model-name", "sim-model",
                      "--max-running-requests", "2"]
SMALL_ENV = {"SGLANG_SIM_DEVICE_TOKENS": "4096"}
