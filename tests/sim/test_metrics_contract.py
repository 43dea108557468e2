"""The simulator's /metrics against SGLang 0.5.23's own metric definitions (read off the pinned
wheel by real_metrics.py), and the metrics roles/monitoring's alerts and dashboard read against both.

A metric the simulator exports must exist in the real server with the same type, the same label
names and (histograms) the same bucket edges; every sglang:* metric the monitoring reads must be
one the real server exports and one the simulator exports, so an alert tested on the simulators
reads what a real fleet serves.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from real_metrics import ROOT, real_metrics
from simharness import SMALL_ENV, SMALL_HICACHE_ARGS

MONITORING = ROOT / "roles" / "monitoring"
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("_sum", "_count", "_created"), "gauge": ()}


def parse_exposition(text: str) -> dict[str, dict]:
    """Prometheus text format → {family: {kind, samples: [(name, {label: value}, value)]}}."""
    families: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            families[name] = {"kind": kind, "samples": []}
        elif line and not line.startswith("#"):
            match = SAMPLE.match(line)
            assert match, f"not an exposition line: {line!r}"
            name = match["name"]
            family = next((f for f, d in families.items() if name == f or any(
                name == f + s for s in SUFFIXES.get(d["kind"], ()))), None)
            assert family, f"sample {name} has no # TYPE line"
            labels = dict(LABEL.findall(match["labels"] or ""))
            families[family]["samples"].append((name, labels, float(match["value"])))
    return families


@pytest.fixture(scope="module")
def real():
    return real_metrics()


@pytest.fixture(scope="module")
def exposition(sim_factory) -> str:
    """/metrics of a HiCache simulator after traffic that hits both tiers (device, then host)."""
    sim = sim_factory(SMALL_HICACHE_ARGS, SMALL_ENV)
    prefix = list(range(1000, 4000))
    gen = {"sampling_params": {"max_new_tokens": 2}}
    sim.post_json("/generate", {"input_ids": prefix, **gen})
    sim.post_json("/generate", {"input_ids": prefix, **gen, "stream": False})  # device hit
    for n in range(2):  # push the prefix out of the 4096-token device pool (the host pool keeps it)
        sim.post_json("/generate", {"input_ids": list(range(10000 + n * 2500, 12500 + n * 2500)), **gen})
    meta = sim.post_json("/generate", {"input_ids": prefix, **gen})["meta_info"]
    assert meta["cached_tokens_details"]["host"] > 0, meta
    status, raw, headers = sim.request("GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return raw.decode()


def test_the_real_collector_is_parsed(real):
    """The parse found what docs/sglang-0.5.23.md names, with the collectors' base labels."""
    assert real["sglang:cached_tokens"].kind == "counter"
    assert "cache_source" in real["sglang:cached_tokens"].labels
    assert real["sglang:hicache_host_used_tokens"].kind == "gauge"
    assert set(real["sglang:num_queue_reqs"].labels) == {
        "model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
    ttft = real["sglang:time_to_first_token_seconds"]
    assert ttft.kind == "histogram"
    assert ttft.buckets
    assert ttft.buckets[0] == 0.1
    assert len(real) > 50


def test_every_simulated_metric_matches_the_real_server(real, exposition):
    families = parse_exposition(exposition)
    assert families, exposition
    for family, data in families.items():
        assert family in real, f"the simulator exports {family}, SGLang 0.5.23 has no such metric"
        want = real[family]
        assert data["kind"] == want.kind, f"{family}: simulator {data['kind']}, real {want.kind}"
        assert data["samples"], f"{family}: no samples"
        for name, labels, _value in data["samples"]:
            names = set(labels) - {"le", "quantile"}
            assert names == set(want.labels), f"{name}: simulator labels {sorted(names)}, real {want.labels}"
        if want.kind == "histogram":
            edges = sorted({float(lb["le"]) for n, lb, _ in data["samples"]
                            if n.endswith("_bucket") and lb["le"] != "+Inf"})
            assert tuple(edges) == want.buckets, f"{family}: bucket edges differ"


def test_cache_sources_are_the_real_label_values(exposition):
    samples = parse_exposition(exposition)["sglang:cached_tokens"]["samples"]
    sources = {labels["cache_source"]: value for _, labels, value in samples}
    assert set(sources) == {"device", "host"}, sources
    assert sources["host"] > 0
    assert sources["device"] > 0


def monitoring_reads() -> set[str]:
    """Every sglang:* metric family named in roles/monitoring (rules, dashboard, templates)."""
    names: set[str] = set()
    for path in MONITORING.rglob("*"):
        if path.is_file() and path.suffix in {".j2", ".yml", ".json", ".py"}:
            names.update(re.findall(r"sglang:[a-z_]+", path.read_text(encoding="utf-8")))
    families = set()
    for name in names:
        for suffix in ("_bucket", "_count", "_sum", "_total"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        families.add(name)
    return families


def test_what_the_monitoring_reads_is_served_by_both(real, exposition):
    reads = monitoring_reads()
    assert {"sglang:cached_tokens", "sglang:time_to_first_token_seconds",
            "sglang:hicache_host_used_tokens"} <= reads, reads
    simulated = parse_exposition(exposition)
    for family in sorted(reads):
        assert family in real, f"roles/monitoring reads {family}: SGLang 0.5.23 exports no such metric"
        assert family in simulated, f"roles/monitoring reads {family}: the simulator does not export it"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (scripts/host-tools.sh)")
def test_promtool_accepts_the_exposition(exposition, tmp_path: Path):
    run = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True,
                         text=True, timeout=60, check=False)
    # check metrics lints names/help too; only parse errors fail here (SGLang's own names use ':').
    assert "error while linting" not in run.stderr, run.stderr
    assert "parse" not in run.stderr.lower(), run.stderr
