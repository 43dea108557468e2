"""Start and stop the SGLang simulator (sim/sglang_sim) as a subprocess on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ansible.module_utils.sglang_probe_client import SGLangClient
from ansible.module_utils.sglang_probe_gate import evaluate_gate, load_baseline
from ansible.module_utils.sglang_probe_measure import run_probe
from procs import free_port, stop_by_pid

REPO = Path(__file__).resolve().parents[2]
SIM_DIR = REPO / "sim"

# The seed's launch command (its section 6), minus what the simulator does not need.
SEED_ARGS = ["--tp-size", "2", "--context-length", "131072", "--mem-fraction-static", "0.80",
             "--max-running-requests", "1", "--chunked-prefill-size", "2048"]
HICACHE_ARGS = ["--enable-hierarchical-cache", "--hicache-size", "12", "--hicache-ratio", "2.0",
                "--hicache-io-backend", "kernel", "--hicache-host-memory-mode", "cache",
                "--hicache-write-policy", "write_through"]


def sim_available() -> bool:
    return (SIM_DIR / "sglang_sim" / "launch_server.py").exists()


def sim_env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SIM_DIR) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # host RAM is the simulator's input, not this machine's: HiCache 12 GB x TP 2 must fit
    env.update({"SGLANG_SIM_TIME_SCALE": "0.001", "SGLANG_SIM_LOAD_DELAY_S": "0", "SGLANG_SIM_HOST_MEM_GB": "64"})
    env.update(extra)
    return env


def write_fixture_model(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "sglang_sim.fixture_model", str(path)], env=sim_env(), check=True,
                   capture_output=True, timeout=60)
    return path


class SimServer:
    """One simulator process; `stop()` ends it by its PID (also when the test failed)."""

    def __init__(self, model_dir: Path, args: list[str], log_path: Path, wait: bool = True,
                 ready: bool = True, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # closed in stop()
        cmd = [sys.executable, "-m", "sglang_sim.launch_server", "--model-path", str(model_dir),
               "--host", "127.0.0.1", "--port", str(self.port), "--enable-cache-report", *args]
        self.proc = subprocess.Popen(cmd, env=sim_env(**env), stdout=self._log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_listening()
            # It listens before its model is loaded (503 on /generate until then, as SGLang): a test
            # that calls the probe's functions directly, without its ready wait, starts on a ready
            # server. ready=False: only until it listens (a server that is never to be healthy).
            if ready:
                self.wait_ready()

    def wait_listening(self, timeout: float = 20.0) -> None:
        """Until it answers /get_model_info at all (an HTTP error, e.g. 401 with --api-key, counts)."""
        self._wait_for("/get_model_info", any_answer=True, what="listen", timeout=timeout)

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until /health answers 200 (open without an API key, as in SGLang): the model is loaded."""
        self._wait_for("/health", any_answer=False, what="become ready", timeout=timeout)

    def _wait_for(self, path: str, any_answer: bool, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the simulator exited with {self.proc.returncode}:\n{self.log()}")
            try:
                urllib.request.urlopen(f"{self.url}{path}", timeout=2).close()
                return
            except urllib.error.HTTPError:
                if any_answer:
                    return
                time.sleep(0.05)  # 503 while its model loads
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the simulator did not {what} within {timeout} s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        stop_by_pid(self.proc)
        self._log.close()


def probe_once(p: dict) -> dict:
    """The probe module's measurement and gate, called as functions (no Ansible)."""
    client = SGLangClient(p["url"], p.get("api_key"), p["request_timeout"])
    result = run_probe(p, client)
    result["gate"] = evaluate_gate(result, p, load_baseline(p.get("baseline")))
    return result
