"""scripts/traffic.py: SGLang's own benchmark client (bench_serving, generated-shared-prefix) sending
repeated long prefixes to real simulator processes on 127.0.0.1, directly and through the real
sglang-router; its bounds (a hanging target, a child that ignores SIGTERM) and the loopback rule.

The client needs a venv with sglang 0.5.23 and transformers: $HICACHE_TRAFFIC_PYTHON, else
.cache/traffic-venv (`make traffic-venv`, built from the demo wheelhouse); the tests that send
traffic skip without one. Every process a test starts is stopped by its PID.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import stop_by_pid

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "sim"))
sys.path.insert(0, str(ROOT / "scripts"))

import traffic  # noqa: E402
from procs import free_port  # noqa: E402
from simharness import SMALL_ENV, SMALL_HICACHE_ARGS, start_sim  # noqa: E402

SCRIPT = ROOT / "scripts" / "traffic.py"
ROUTER_PYTHON = ROOT / ".cache" / "sglang-router-venv" / "bin" / "python"


def _client_python() -> tuple[str | None, str]:
    candidate = os.environ.get("HICACHE_TRAFFIC_PYTHON") or str(ROOT / ".cache" / "traffic-venv" / "bin" / "python")
    if not Path(candidate).exists():
        return None, (f"no traffic client venv ({candidate}): `make traffic-venv` builds it from the demo "
                      "wheelhouse (make demo / molecule's prepare builds that), or set HICACHE_TRAFFIC_PYTHON")
    probe = ("import importlib.util as u, sys; "
             "sys.exit(0 if all(u.find_spec(m) for m in ('sglang', 'transformers', 'tokenizers')) else 1)")
    if subprocess.run([candidate, "-c", probe], check=False).returncode != 0:
        return None, f"{candidate} lacks sglang, transformers or tokenizers (requirements/traffic.txt)"
    return candidate, ""


CLIENT, NO_CLIENT = _client_python()


def needs_client(test):
    """A test that runs the client venv: make test runs it once molecule's shared step built it."""
    return pytest.mark.shared_state(pytest.mark.skipif(CLIENT is None, reason=NO_CLIENT)(test))


# Two prefixes of 3,072 tokens and a device pool of 4,096 (SMALL_ENV): the second prefix evicts the
# first from the device, which then comes back from the HiCache host tier (2 x 4,096 tokens).
WORKLOAD = ["--groups", "2", "--prompts-per-group", "4", "--prefix-len", "3072", "--question-len", "64",
            "--output-len", "8", "--request-rate", "50", "--max-concurrency", "1"]
PROMPT_LEN = 3072 + 64


def run_traffic(tmp_path: Path, *args: str, python: str | None = None, timeout: float = 120) -> tuple[int, dict, float]:
    out = tmp_path / "summary.json"
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--python", python or CLIENT, "--work-dir", str(tmp_path / "work"),
         "--output", str(out), *args],
        capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.monotonic() - start
    assert out.exists(), f"no summary (rc {result.returncode}):\n{result.stdout}\n{result.stderr}"
    summary = json.loads(out.read_text())
    assert json.loads(result.stdout) == summary
    return result.returncode, summary, wall


def metrics(sim) -> dict[str, float]:
    """The simulator's /metrics samples, summed over labels other than cache_source."""
    status, body, _ = sim.request("GET", "/metrics")
    assert status == 200
    values: dict[str, float] = {}
    for line in body.decode().splitlines():
        m = re.match(r'^(sglang:\w+)(\{[^}]*\})? ([0-9.eE+-]+)$', line)
        if not m:
            continue
        source = re.search(r'cache_source="(\w+)"', m.group(2) or "")
        key = m.group(1) + (f":{source.group(1)}" if source else "")
        values[key] = values.get(key, 0.0) + float(m.group(3))
    return values


def group_members(pgid: int) -> list[str]:
    """Live (not zombie) processes of process group pgid, as 'pid state comm'."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm_end = text.rindex(")")
        fields = text[comm_end + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(f"{stat.parent.name} {fields[0]} {text[text.index('(') + 1:comm_end]}")
    return members


def gone(pgid: int, wait_s: float = 3.0) -> bool:
    """The child (its PGID is its PID) and everything it started have exited (orphans reaped or not)."""
    deadline = time.monotonic() + wait_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def model_dir(tmp_path):
    from sglang_sim.fixture_model import write_model_dir

    return write_model_dir(tmp_path / "model")


@pytest.fixture
def sims(tmp_path, model_dir):
    started = []

    def start(n: int = 1, env: dict[str, str] | None = None):
        new = [start_sim(tmp_path, model_dir, SMALL_HICACHE_ARGS, {**SMALL_ENV, **(env or {})}) for _ in range(n)]
        started.extend(new)
        return new

    yield start
    for sim in started:
        stop_by_pid(sim.proc)


# --- the loopback rule and the bounds, without a client venv ---------------------------------------


@pytest.mark.parametrize("url", ["http://10.0.0.7:30004", "http://192.168.1.20:30004", "http://192.0.2.1",
                                 "http://[2001:db8::1]:30004", "https://example.invalid:30000"])
def test_a_target_outside_loopback_is_refused_before_anything_runs(tmp_path, url):
    result = subprocess.run([sys.executable, str(SCRIPT), "--python", "/nonexistent/python", "--target", url,
                             "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, check=False)
    assert result.returncode == 2, result
    assert "is not a loopback address" in result.stderr
    assert "--fleet" in result.stderr
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:30004", "http://127.0.30.2:30004/", "http://localhost:8000",
                                 "http://[::1]:30004"])
def test_loopback_targets_pass(url):
    assert traffic.check_target(url, fleet=False) == url.rstrip("/")


def test_fleet_flag_allows_other_addresses_and_credentials_never():
    assert traffic.check_target("http://10.0.0.7:30004", fleet=True) == "http://10.0.0.7:30004"
    with pytest.raises(ValueError, match="no credentials"):
        traffic.check_target("http://user:secret@127.0.0.1:30004", fleet=False)
    with pytest.raises(ValueError, match="not an http"):
        traffic.check_target("ftp://127.0.0.1/", fleet=False)


@pytest.mark.parametrize(("args", "message"), [
    (["--groups", "200", "--prompts-per-group", "51"], "at most 10000"),
    (["--timeout", "0"], "--timeout must be"),
    (["--timeout", "3601"], "--timeout must be"),
    (["--request-rate", "inf"], "--request-rate must be"),
])
def test_count_and_time_are_bounded(args, message):
    result = subprocess.run([sys.executable, str(SCRIPT), "--target", "http://127.0.0.1:1", *args],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


def test_a_child_that_ignores_sigterm_is_killed_with_its_group_at_the_bound(tmp_path, request):
    """A stand-in client (it ignores SIGTERM and starts a grandchild) shows the bound on its own."""
    pids = tmp_path / "pids"
    fake = tmp_path / "fake-python"
    fake.write_text(
        "#!/bin/sh\n"
        f"sleep 600 & echo $! >{pids}\n"
        "trap '' TERM\n"
        "while :; do sleep 1; done\n")
    fake.chmod(0o755)
    rc, summary, wall = run_traffic(tmp_path, "--target", "http://127.0.0.1:1", "--timeout", "2", python=str(fake))
    run = summary["targets"][0]
    request.addfinalizer(lambda: [os.kill(int(m.split()[0]), signal.SIGKILL) for m in group_members(run["child_pid"])])
    assert rc == 1
    assert summary["timed_out"]
    assert run["timed_out"]
    assert run["child_rc"] == -signal.SIGKILL  # SIGTERM ignored: SIGKILL after the grace period
    assert 2 <= wall < 2 + traffic.STOP_GRACE_S + 3, wall
    assert gone(run["child_pid"])
    assert int(pids.read_text()) != run["child_pid"]  # the grandchild was started, and is in no live group member
    assert summary["completed"] == 0
    assert summary["failed"] == summary["sent"] == 8 * 2


@pytest.mark.shared_state
def test_the_tokenizer_written_for_the_simulator_loads_in_the_client(tmp_path):
    path = traffic.write_tokenizer(tmp_path / "tok", vocab_size=500)
    data = json.loads((path / "tokenizer.json").read_text())
    assert data["model"]["type"] == "WordLevel"
    assert sorted(data["model"]["vocab"].values()) == list(range(500))
    if CLIENT is None:
        pytest.skip(NO_CLIENT)
    code = ("import sys; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]); "
            "print(len(t.get_vocab()), t.encode('t5 t7 nonsense', add_special_tokens=False))")
    out = subprocess.run([CLIENT, "-c", code, str(path)], capture_output=True, text=True, check=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}).stdout.strip()
    assert out == "500 [5, 7, 0]"


# --- SGLang's benchmark client against simulator processes ------------------------------------------


@needs_client
def test_repeated_prefixes_reach_the_simulator_and_come_back_from_both_tiers(tmp_path, sims):
    (sim,) = sims(1)
    rc, summary, _ = run_traffic(tmp_path, "--target", sim.base, *WORKLOAD, "--timeout", "90")
    run = summary["targets"][0]
    assert rc == 0, run.get("log_tail")
    assert run["child_rc"] == 0
    assert not run["timed_out"]
    assert (summary["sent"], summary["completed"], summary["failed"]) == (8, 8, 0)
    assert summary["workload"]["prefix_len"] == 3072
    assert summary["workload"]["question_len"] == 64
    assert run["ttft_ms"]["p50"] > 0
    assert run["ttft_ms"]["p95"] >= run["ttft_ms"]["p50"]
    assert run["total_input_tokens"] == 8 * PROMPT_LEN  # token ids: the simulator sees exactly these lengths

    m = metrics(sim)
    # bench_serving's one warm-up request (the first prompt, cold) comes on top of the eight.
    assert m["sglang:num_requests_total"] == 8 + 1
    assert m["sglang:prompt_tokens_total"] == 9 * PROMPT_LEN
    assert m["sglang:cached_tokens_total:device"] > 0
    assert m["sglang:cached_tokens_total:host"] > 0, m  # a prefix evicted from the device, read from host
    # What the client counted from each response's meta_info is what the server counted.
    assert run["cached_tokens"]["device"] == m["sglang:cached_tokens_total:device"]
    assert run["cached_tokens"]["host"] == m["sglang:cached_tokens_total:host"]
    # Seven of eight prompts share a prefix read before them (whole 128-token blocks of 3,072).
    assert run["cached_tokens"]["total"] >= 6 * 3072
    assert {s["module"] for s in run["stand_ins"]} <= {"sglang.srt.disaggregation.utils", "datasets"}


def test_the_summary_counts_from_the_last_line_of_bench_servings_output(tmp_path):
    out = tmp_path / "bench.jsonl"
    old = {"completed": 9, "errors": [], "ttfts": []}
    new = {"completed": 3, "errors": ["", "HTTP 500", "", ""], "ttfts": [0.01, 0.5, 0.02, 0.03],
           "median_ttft_ms": 20.0, "p95_ttft_ms": 29.0, "total_input_tokens": 12,
           "cache_report": {"total_cached_tokens": 7, "device_cached_tokens": 5, "host_cached_tokens": 2}}
    out.write_text(json.dumps(old) + "\n" + json.dumps(new) + "\n")
    summary = traffic.summarize_output(out, sent=5)  # one request never came back at all
    assert (summary["completed"], summary["failed"]) == (3, 2)
    assert summary["errors"] == ["HTTP 500"]
    assert summary["ttft_ms"]["p50"] == 20.0
    assert summary["ttft_ms"]["p95_recomputed"] == pytest.approx(29.0)  # the failed request's TTFT left out
    assert summary["cached_tokens"]["device"] == 5
    assert summary["cached_tokens"]["host"] == 2
    assert traffic.summarize_output(tmp_path / "none.jsonl", sent=5)["failed"] == 5


@needs_client
def test_targets_run_one_after_the_other_and_a_failing_one_is_counted_failed(tmp_path, sims):
    """A healthy simulator, then one whose generate routes answer 500 (bench_serving itself then ends
    with an error and writes no output file: every request it was to send counts as failed)."""
    (healthy,) = sims(1)
    (broken,) = sims(1, {"SGLANG_SIM_FAULT": "generate_500"})
    rc, summary, _ = run_traffic(tmp_path, "--target", healthy.base, "--target", broken.base, "--groups", "1",
                                 "--prompts-per-group", "4", "--prefix-len", "1024", "--question-len", "32",
                                 "--output-len", "4", "--request-rate", "50", "--warmup-requests", "0",
                                 "--timeout", "120")
    ok, bad = summary["targets"]
    assert rc == 1
    assert (ok["sent"], ok["completed"], ok["failed"], ok["child_rc"]) == (4, 4, 0, 0)
    assert (bad["sent"], bad["completed"], bad["failed"]) == (4, 0, 4)
    assert bad["child_rc"] != 0
    assert bad["result_file"] is None
    assert bad["log_tail"]
    assert (summary["sent"], summary["completed"], summary["failed"]) == (8, 4, 4)
    assert metrics(healthy)["sglang:num_requests_total"] == 4
    assert metrics(broken).get("sglang:num_requests_total", 0) == 0


@needs_client
def test_the_traffic_shows_the_degrade_under_traffic_fault(tmp_path, sims):
    """The simulator fault a single probe misses (degrade_under_traffic: slower after N requests) shows
    in the traffic's TTFT: same workload, a healthy and a degrading simulator, time scale 0.01."""
    slow = {"SGLANG_SIM_TIME_SCALE": "0.01"}
    (healthy,) = sims(1, slow)
    (degrading,) = sims(1, {**slow, "SGLANG_SIM_FAULT": "degrade_under_traffic", "SGLANG_SIM_DEGRADE_AFTER": "2"})
    rc, summary, _ = run_traffic(tmp_path, "--target", healthy.base, "--target", degrading.base, *WORKLOAD,
                                 "--timeout", "120")
    assert rc == 0
    ok, bad = summary["targets"]
    assert ok["completed"] == bad["completed"] == 8
    # Cached prefixes: a few ms healthy; degraded, even a cached prompt pays 45 % of a cold prefill (~21 ms).
    assert bad["ttft_ms"]["p50"] > 3 * ok["ttft_ms"]["p50"], (ok["ttft_ms"], bad["ttft_ms"])


@needs_client
def test_an_api_key_goes_by_environment_and_never_into_argv_or_the_summary(tmp_path, model_dir):
    key = "traffic-Key-7q"
    sim = start_sim(tmp_path, model_dir, [*SMALL_HICACHE_ARGS, "--api-key", key], SMALL_ENV)
    try:
        env = {**os.environ, "SIM_KEY": key}
        out = tmp_path / "summary.json"
        cmd = [sys.executable, str(SCRIPT), "--python", CLIENT, "--target", sim.base, "--groups", "1",
               "--prompts-per-group", "2", "--prefix-len", "512", "--question-len", "16", "--output-len", "2",
               "--request-rate", "50", "--work-dir", str(tmp_path / "work"), "--output", str(out), "--timeout", "90"]
        # Without the key: 401s (bench_serving waits for /v1/models to answer 200 until the bound).
        without = subprocess.run([*cmd, "--timeout", "4"], capture_output=True, text=True, env=env, check=False,
                                 timeout=60)
        assert without.returncode == 1
        assert json.loads(out.read_text())["completed"] == 0
        with_key = subprocess.run([*cmd, "--api-key-env", "SIM_KEY"], capture_output=True, text=True, env=env,
                                  check=False, timeout=120)
        assert with_key.returncode == 0, with_key.stdout
        summary = json.loads(out.read_text())
        assert summary["completed"] == 2
        assert key not in out.read_text()
        assert key not in " ".join(cmd)
        assert metrics(sim)["sglang:num_requests_total"] == 2 + 1
    finally:
        stop_by_pid(sim.proc)


@needs_client
@pytest.mark.skipif(not ROUTER_PYTHON.exists(), reason="no sglang-router venv in .cache (molecule prepares it)")
def test_through_the_real_router_every_request_reaches_a_simulator(tmp_path, sims):
    workers = sims(2)
    port = free_port()
    log = (tmp_path / "router.log").open("w")
    router = subprocess.Popen(
        [str(ROUTER_PYTHON), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--policy", "cache_aware",
         "--log-level", "warn", "--worker-urls", *[w.base for w in workers]],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert router.poll() is None, (tmp_path / "router.log").read_text()
                assert time.monotonic() < deadline, "the router did not listen within 60 s"
                time.sleep(0.3)
        rc, summary, _ = run_traffic(tmp_path, "--target", url, *WORKLOAD, "--timeout", "90")
    finally:
        stop_by_pid(router)
        log.close()
    run = summary["targets"][0]
    assert rc == 0, run.get("log_tail")
    assert (summary["completed"], summary["failed"]) == (8, 0)
    per_worker = [metrics(w) for w in workers]
    assert sum(m["sglang:num_requests_total"] for m in per_worker) == 8 + 1
    cached = sum(m.get("sglang:cached_tokens_total:device", 0) + m.get("sglang:cached_tokens_total:host", 0)
                 for m in per_worker)
    assert cached == run["cached_tokens"]["total"] > 0


@needs_client
def test_a_hanging_target_ends_within_the_bound_and_the_child_is_gone(tmp_path):
    """A listener that never answers: bench_serving waits for it; the generator stops it at --timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # connections complete in the backlog; no byte ever comes back
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        rc, summary, wall = run_traffic(tmp_path, "--target", url, "--groups", "1", "--prompts-per-group", "2",
                                        "--timeout", "8")
    run = summary["targets"][0]
    assert rc == 1
    assert run["timed_out"]
    assert summary["timed_out"]
    assert wall < 8 + traffic.STOP_GRACE_S + 4, wall
    assert run["child_rc"] in (-signal.SIGTERM, -signal.SIGKILL, 143, 137), run
    assert gone(run["child_pid"])
    assert (summary["completed"], summary["failed"]) == (0, 2)
