"""How exact is the probe's TTFT, and what does a 128K request cost the client?

Prints figures, asserts none (a benchmark, not a test):

1. client-side cost of one 128K-token request: seeded id generation + JSON serialisation
   (target: well under 100 ms);
2. the probe's TTFT against the simulator's known TTFT at 128K (cold, warm device, warm host):
   the simulator reports the TTFT its engine measured (meta_info.sglang_sim.ttft_s) and the
   modelled prefill; median error target < 5 ms;
3. the same against a reference server in this file whose TTFT is exactly known (it stamps the
   moment it starts handling the request and the moment it writes the first token), which isolates
   the probe's own overhead from the simulator's request parsing.

Run: .venv/bin/python benchmarks/probe_accuracy.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import ansible.module_utils  # noqa: E402
from procs import stop_by_pid  # noqa: E402  (the one stop-by-PID helper of the test suites)

# The probe's module_utils, under the name Ansible gives them (ansible.cfg: module_utils).
ansible.module_utils.__path__.append(str(REPO / "module_utils"))
from ansible.module_utils.sglang_probe_client import SGLangClient, flush_cache, generate_body, generate_ids  # noqa: E402
from ansible.module_utils.sglang_probe_measure import extract_server_facts, filler_lengths  # noqa: E402

INPUT_LEN = 128_000
VOCAB = 248_320  # the seed model's vocabulary (the simulator's fixture model)
REFERENCE_TTFT_S = 0.192  # 192 s scaled 1000x, as the simulator does


def ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    s = sorted(values)
    p90 = s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]
    return f"median {statistics.median(s) * 1000:7.2f} ms   p90 {p90 * 1000:7.2f} ms   (n={len(s)})"


def client_cost(rounds: int) -> None:
    gen, ser = [], []
    for i in range(rounds):
        t0 = time.perf_counter()
        ids = generate_ids(INPUT_LEN, VOCAB, 42 + i)
        t1 = time.perf_counter()
        body = generate_body(ids, 512, 0.0)
        t2 = time.perf_counter()
        gen.append(t1 - t0)
        ser.append(t2 - t1)
    total = [a + b for a, b in zip(gen, ser, strict=True)]
    print(f"== client-side cost of one {INPUT_LEN}-token request ({len(body) / 1e6:.2f} MB body)")
    print(f"   id generation      {ms(gen)}")
    print(f"   serialisation      {ms(ser)}")
    print(f"   total              {ms(total)}   target: well under 100 ms")


# ---- the simulator ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sim(workdir: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "sim"), SGLANG_SIM_TIME_SCALE="0.001", SGLANG_SIM_LOAD_DELAY_S="0",
               SGLANG_SIM_HOST_MEM_GB="64")
    model = workdir / "model"
    subprocess.run([sys.executable, "-m", "sglang_sim.fixture_model", str(model)], env=env, check=True,
                   capture_output=True, timeout=60)
    port = free_port()
    log = open(workdir / "sim.log", "wb")  # lives as long as the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_sim.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
         "--port", str(port), "--tp-size", "2", "--context-length", "131072", "--mem-fraction-static", "0.80",
         "--max-running-requests", "1", "--enable-cache-report", "--enable-hierarchical-cache",
         "--hicache-size", "12", "--hicache-ratio", "2.0", "--hicache-write-policy", "write_through"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        if proc.poll() is not None:
            raise SystemExit(f"the simulator exited: {(workdir / 'sim.log').read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
            return proc, url
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the simulator did not come up")


def against_simulator(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_sim(Path(tmp))
        try:
            client = SGLangClient(url, None, 120)
            info = extract_server_facts(client.get_json(("/get_server_info",)), {})
            fillers = filler_lengths(info["max_total_num_tokens"], INPUT_LEN, 1.0, info["max_req_input_len"])
            body = generate_body(generate_ids(INPUT_LEN, VOCAB, 42), 4, 0.0)
            errors: dict[str, dict[str, list[float]]] = {}
            for _ in range(rounds):
                flush_cache(client, 30)
                cases = [("cold", client.stream_generate(body)), ("warm device", client.stream_generate(body))]
                for j, n in enumerate(fillers):
                    client.stream_generate(generate_body(generate_ids(n, VOCAB, f"f{j}"), 1, 0.0),
                                           need_accounting=False)
                cases.append(("warm host", client.stream_generate(body)))
                for name, run in cases:
                    sim = run["meta_info"]["sglang_sim"]
                    e = errors.setdefault(name, {"engine": [], "modelled": []})
                    e["engine"].append(run["ttft_s"] - sim["ttft_s"])
                    e["modelled"].append(run["ttft_s"] - sim["modelled_prefill_s"] * sim["time_scale"])
        finally:
            stop_by_pid(proc)
    print(f"== probe TTFT minus the simulator's TTFT at {INPUT_LEN} tokens (time scale 0.001)")
    for name, e in errors.items():
        print(f"   {name:<12} vs engine-measured  {ms(e['engine'])}")
        print(f"   {'':<12} vs modelled         {ms(e['modelled'])}")
    parse = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        array("q", json.loads(body)["input_ids"])
        parse.append(time.perf_counter() - t0)
    print(f"   the simulator parses the body before its clock starts; the same parse here: {ms(parse)}")
    print("   (that parsing counts in any client-side TTFT, as it does in SGLang's own benchmark)")


# ---- a reference server with an exactly known TTFT -----------------------------------------------


class Reference(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        start = time.perf_counter()  # headers parsed: the request has arrived
        remaining = int(self.headers["Content-Length"])
        while remaining:
            remaining -= len(self.rfile.read(min(remaining, 1 << 20)))
        target = start + REFERENCE_TTFT_S
        while (left := target - time.perf_counter()) > 0:
            time.sleep(left)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        server_ttft = time.perf_counter() - start
        meta = {"prompt_tokens": INPUT_LEN, "completion_tokens": 1, "cached_tokens": 0,
                "finish_reason": {"type": "length"}, "server_ttft_s": server_ttft}
        for data in (b"data: " + json.dumps({"text": "x", "meta_info": meta}).encode() + b"\n\n",
                     b"data: [DONE]\n\n", b""):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def serve_reference() -> None:
    """Child process: serve the reference on a free port, print it, run until terminated."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Reference)
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


def against_reference(rounds: int) -> None:
    # in its own process, so the client and the server do not share one interpreter lock
    proc = subprocess.Popen([sys.executable, __file__, "--serve-reference"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        client = SGLangClient(f"http://127.0.0.1:{port}", None, 60)
        body = generate_body(generate_ids(INPUT_LEN, VOCAB, 42), 1, 0.0)
        errors = []
        for _ in range(rounds):
            run = client.stream_generate(body)
            errors.append(run["ttft_s"] - run["meta_info"]["server_ttft_s"])
    finally:
        stop_by_pid(proc)
    print(f"== probe TTFT minus a reference server's exact TTFT ({REFERENCE_TTFT_S * 1000:.0f} ms, {INPUT_LEN} ids)")
    print(f"   probe overhead     {ms(errors)}   target: < 5 ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--record", action="store_true",
                        help="write the printed figures into docs/benchmarks.md (benchmarks/record.py)")
    parser.add_argument("--serve-reference", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_reference:
        serve_reference()
        return
    client_cost(max(args.rounds, 5) * 2)
    if (REPO / "sim" / "sglang_sim").is_dir():
        against_simulator(args.rounds)
    else:
        print("== simulator not in this tree: skipped the comparison with it")
    against_reference(args.rounds)


if __name__ == "__main__":
    import record  # benchmarks/record.py: --record writes the figures into docs/benchmarks.md

    raise SystemExit(record.run(main, "probe_accuracy"))
