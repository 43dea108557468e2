"""Benchmark: the SGLang simulator's own overhead per request, and its memory with a full host pool.

Prints figures; asserts nothing about speed. It starts the simulator (sim/) as a subprocess on
127.0.0.1 with SGLANG_SIM_TIME_SCALE=0, so every modelled delay is zero and what remains is the
simulator's own work: HTTP, JSON parsing of 128K input ids, hashing the pages, the cache match and
insert, the response. Request bodies are encoded before the clock starts. Target: a median under
20 ms at 128K input ids, so the overhead never blurs a TTFT the simulator models.

    python benchmarks/sim_overhead.py [--n 20] [--tokens 128000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

SIM_DIR = Path(__file__).resolve().parents[1] / "sim"
sys.path.insert(0, str(SIM_DIR.parent / "tests"))
from procs import stop_by_pid  # noqa: E402  (the one stop-by-PID helper of the test suites)

sys.path.insert(0, str(SIM_DIR))

from sglang_sim.fixture_model import write_model_dir  # noqa: E402

SEED_ARGS = ["--tp-size", "2", "--mem-fraction-static", "0.80", "--context-length", "196608",
             "--enable-hierarchical-cache", "--hicache-size", "12", "--hicache-ratio", "2.0",
             "--hicache-write-policy", "write_through", "--enable-cache-report"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(base: str, body: bytes) -> tuple[float, dict]:
    """POST /generate as one write with TCP_NODELAY (as aiohttp does), so the figure is not
    the client's Nagle/delayed-ACK stall."""
    host, port = base.rsplit("/", 1)[-1].split(":")
    head = (f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        sock.sendall(head + body)
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        raw = resp.read()
        elapsed = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"/generate answered {resp.status}: {raw[:200]!r}")
    return elapsed, json.loads(raw)


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _body(ids: list[int]) -> bytes:
    return json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="requests per measurement")
    parser.add_argument("--record", action="store_true",
                        help="write the printed figures into docs/benchmarks.md (benchmarks/record.py)")
    parser.add_argument("--tokens", type=int, default=128_000, help="input ids per request")
    opts = parser.parse_args()
    rng = random.Random(42)
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model_dir(Path(tmp) / "seed-27b")
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM_")}
        env.update({"PYTHONPATH": str(SIM_DIR), "SGLANG_SIM_TIME_SCALE": "0",
                    "SGLANG_SIM_LOAD_DELAY_S": "0", "SGLANG_SIM_HOST_MEM_GB": "1000"})
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_sim.launch_server", "--model-path", str(model),
             "--host", "127.0.0.1", "--port", str(port), *SEED_ARGS],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        print("simulator did not come up", file=sys.stderr)
                        return 1
                    time.sleep(0.05)
            info = json.loads(urllib.request.urlopen(base + "/get_server_info").read())
            host_total = info["sglang_sim"]["host_pool_tokens"]
            rss_idle = _rss_mb(proc.pid)

            cold_bodies = [_body([rng.randrange(248_320) for _ in range(opts.tokens)])
                           for _ in range(opts.n)]
            cold_runs = [_post(base, body) for body in cold_bodies]
            warm_runs = [_post(base, cold_bodies[-1]) for _ in range(opts.n)]
            cold = [elapsed for elapsed, _ in cold_runs]
            warm = [elapsed for elapsed, _ in warm_runs]
            server_cold = [r["meta_info"]["sglang_sim"]["server_s"] for _, r in cold_runs]
            server_warm = [r["meta_info"]["sglang_sim"]["server_s"] for _, r in warm_runs]
            assert all(r["meta_info"]["cached_tokens"] == 0 for _, r in cold_runs)
            assert all(r["meta_info"]["cached_tokens"] == opts.tokens - 1 for _, r in warm_runs)

            # Fill the host pool: distinct prompts until it holds what it can.
            filled = json.loads(urllib.request.urlopen(base + "/get_server_info").read())
            extra = 0
            while filled["sglang_sim"]["host_used_tokens"] < host_total - opts.tokens and extra < 50:
                _post(base, _body([rng.randrange(248_320) for _ in range(opts.tokens)]))
                filled = json.loads(urllib.request.urlopen(base + "/get_server_info").read())
                extra += 1
            sim = filled["sglang_sim"]
            rss_full = _rss_mb(proc.pid)
        finally:
            stop_by_pid(proc)

    def ms(values: list[float]) -> str:
        return (f"median {statistics.median(values) * 1e3:.1f} ms, "
                f"min {min(values) * 1e3:.1f} ms, max {max(values) * 1e3:.1f} ms")

    print(f"sglang-sim overhead per request at {opts.tokens} input ids, N={opts.n}, time scale 0")
    print("  the simulator's own work (server side: read body, parse, hash pages, match, insert,")
    print("  build the first output), meta_info.sglang_sim.server_s:")
    print(f"    cold (miss: insert, write-through, evict): {ms(server_cold)}")
    print(f"    warm (device hit):                         {ms(server_warm)}")
    print("    target: median under 20 ms")
    print("  whole HTTP round trip on 127.0.0.1 incl. the client sending ~0.9 MB (body pre-encoded):")
    print(f"    cold: {ms(cold)}")
    print(f"    warm: {ms(warm)}")
    print(f"memory: RSS {rss_idle:.1f} MB idle, {rss_full:.1f} MB with the host pool at "
          f"{sim['host_used_tokens']}/{host_total} tokens "
          f"(device {sim['device_used_tokens']}/{sim['device_pool_tokens']}, "
          f"{sim['cached_blocks']} cached blocks)")
    return 0


if __name__ == "__main__":
    import record  # benchmarks/record.py: --record writes the figures into docs/benchmarks.md

    raise SystemExit(record.run(main, "sim_overhead"))
