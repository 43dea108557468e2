"""The bake's queries against a real Prometheus (the Debian package's /usr/bin/prometheus, when this
machine has it): three fake SGLang /metrics endpoints on 127.0.0.1 scraped every second, one of them
with a TTFT ten times the others'. Proves the PromQL the module sends parses, selects by the
monitoring role's job and instance labels, and yields the figures the fake Prometheus tests assume."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible.module_utils.fleet_bake import ARGUMENT_SPEC, THRESHOLD_SPEC, bake
from procs import free_port, stop_by_pid

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary on this machine")
BUCKETS = ("0.1", "0.2", "0.4", "0.8", "1", "2", "4", "+Inf")


def exposition(scrapes: int, ttft_bucket: str) -> str:
    """SGLang-shaped counters after `scrapes` scrapes, 10 requests of 1000 prompt tokens each time,
    every TTFT in the bucket whose upper edge is ttft_bucket."""
    n = 10 * scrapes
    lines = ["# TYPE sglang:num_requests_total counter",
             f'sglang:num_requests_total{{is_streaming="false"}} {n}',
             "# TYPE sglang:prompt_tokens_total counter",
             f'sglang:prompt_tokens_total{{is_streaming="false"}} {n * 1000}',
             "# TYPE sglang:cached_tokens_total counter",
             f'sglang:cached_tokens_total{{cache_source="device"}} {n * 300}',
             f'sglang:cached_tokens_total{{cache_source="host"}} {n * 400}',
             "# TYPE sglang:num_aborted_requests_total counter",
             "sglang:num_aborted_requests_total 0",
             "# TYPE sglang:time_to_first_token_seconds histogram"]
    hit = False
    for le in BUCKETS:
        hit = hit or le == ttft_bucket
        lines.append(f'sglang:time_to_first_token_seconds_bucket{{le="{le}"}} {n if hit else 0}')
    lines += [f"sglang:time_to_first_token_seconds_sum {n * 0.1}", f"sglang:time_to_first_token_seconds_count {n}"]
    return "\n".join(lines) + "\n"


class Exporter:
    def __init__(self, ttft_bucket: str) -> None:
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                exporter.scrapes += 1
                body = exposition(exporter.scrapes, ttft_bucket).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def scraped_fleet(tmp_path):
    exporters = {"gpu-1": Exporter("0.2"), "gpu-2": Exporter("0.2"), "gpu-3": Exporter("2")}
    port = free_port()
    config = tmp_path / "prometheus.yml"
    targets = "\n".join(
        f"      - targets: ['{e.target}']\n        labels: {{fleet_host: {h}, sglang_instance: main}}"
        for h, e in exporters.items())
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n"
                      "  - job_name: sglang\n    metrics_path: /metrics\n    static_configs:\n" + targets + "\n")
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and min(e.scrapes for e in exporters.values()) < 8:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
        assert min(e.scrapes for e in exporters.values()) >= 8, (tmp_path / "prometheus.log").read_text()[-3000:]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as resp:
            assert resp.status == 200
        yield f"http://127.0.0.1:{port}", {h: e.target for h, e in exporters.items()}
    finally:
        stop_by_pid(proc)
        log.close()
        for e in exporters.values():
            e.stop()


def test_the_bake_against_a_real_prometheus_fails_the_slow_host_and_passes_the_other(scraped_fleet):
    url, targets = scraped_fleet
    p = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    p["thresholds"] = {name: spec["default"] for name, spec in THRESHOLD_SPEC.items()}
    p.update(prometheus_url=url, window_s=6, min_requests=20, others=[targets["gpu-1"]],
             instances=[{"host": "gpu-2", "targets": [targets["gpu-2"]], "validated": {"cold_ttft_ms": 900.0}},
                        {"host": "gpu-3", "targets": [targets["gpu-3"]], "validated": {"cold_ttft_ms": 900.0}}])
    result = bake(p)
    assert result["error"] is None, result
    gpu2, gpu3 = result["hosts"]["gpu-2"], result["hosts"]["gpu-3"]
    assert gpu2["verdict"] == "passed", gpu2
    assert gpu2["figures"]["requests"] >= 20
    assert gpu2["figures"]["tier_share"] == {"device": 0.3, "host": 0.4}
    assert gpu2["figures"]["error_rate"] == 0.0
    assert gpu2["figures"]["restarts"] == 0
    assert 100.0 < gpu2["figures"]["ttft_p95_ms"] <= 200.0
    assert 100.0 < result["others"]["ttft_p95_ms"] <= 200.0
    assert gpu3["verdict"] == "failed"
    assert 1000.0 < gpu3["figures"]["ttft_p95_ms"] <= 2000.0
    assert any(r.startswith(f"TTFT p95 {gpu3['figures']['ttft_p95_ms']:.1f} ms is ") and "the other hosts'" in r
               for r in gpu3["reasons"]), gpu3["reasons"]
    assert result["verdict"] == "failed"
    assert result["failed_hosts"] == ["gpu-3"]
