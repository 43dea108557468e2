"""Verify playbooks/ab_benchmark.yml: what it wrote on the controller, and the host it left behind.

The side effect ran the A/B against the simulator with the seed-shaped fixture model, so the
capacities are the seed's (233,207 tokens without HiCache, 159,692 with it: -31.5 %). The record,
the table and the chart are read on the controller; the host must be back on its validated config
(HiCache on), serving. Idempotence (the step before verify) already proved the config is exactly
the converged one.
"""

from __future__ import annotations

import json
import os
import struct
import urllib.request
from pathlib import Path

import pytest
import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

PROJECT = Path(__file__).resolve().parents[3]
REPORTS = PROJECT / ".cache" / "ab-benchmark-reports"
HOST = "ab-benchmark-1"
ADDRESS = "127.0.18.1"
PORT = 30004
UNIT = "sglang-main.service"
TIERS = ["cold", "device", "host"]


@pytest.fixture(scope="module")
def record_path() -> Path:
    records = sorted(REPORTS.glob(f"{HOST}-*.json"))
    assert len(records) == 1, f"expected one A/B record in {REPORTS}, found {records}"
    return records[0]


@pytest.fixture(scope="module")
def record(record_path) -> dict:
    return json.loads(record_path.read_text())


def server_info() -> dict:
    with urllib.request.urlopen(f"http://{ADDRESS}:{PORT}/get_server_info", timeout=10) as answer:
        return json.load(answer)


def journal(host) -> str:
    return host.run(f"journalctl -u {UNIT} -n 30 --no-pager").stdout


def test_record_has_both_launches_and_every_tier(record):
    assert record["host"] == HOST
    assert (record["input_len"], record["repeats"], record["seed"]) == (64000, 3, 42)
    cases = record["cases"]
    assert [(c["hicache"], c["tier"]) for c in cases] == [(False, t) for t in TIERS] + [(True, t) for t in TIERS]
    for case in cases:
        assert len(case["ttfts_ms"]) == 3, case  # N repeats, median reported
        assert case["median_ttft_ms"] > 0
        assert case["input_throughput"] > 0
    # The two launches differ only in the HiCache arguments.
    servers = record["servers"]
    assert servers["baseline"]["enable_hierarchical_cache"] is False
    assert servers["hicache"]["enable_hierarchical_cache"] is True


def test_capacity_price_is_the_seeds(record):
    capacity = {c["hicache"]: c["max_total_num_tokens"] for c in record["cases"]}
    assert capacity == {False: 233_207, True: 159_692}
    assert round(100 * (capacity[True] - capacity[False]) / capacity[False], 1) == -31.5


def test_only_hicache_brings_the_evicted_prefix_back_from_host_ram(record):
    case = {(c["hicache"], c["tier"]): c for c in record["cases"]}
    # Without HiCache a prefix pushed out of GPU memory is gone: recomputed, as slow as cold.
    assert case[(False, "host")]["median_cached_tokens"] < 0.1 * 64000
    assert case[(False, "host")]["median_ttft_ms"] > 0.5 * case[(False, "cold")]["median_ttft_ms"]
    # With HiCache it comes back from host RAM (the cache report shows it, not only the TTFT).
    assert case[(True, "host")]["host_cached_fraction"] >= 0.9
    assert case[(True, "host")]["median_ttft_ms"] < 0.2 * case[(True, "cold")]["median_ttft_ms"]
    # A prefix still in GPU memory is a hit either way.
    for hicache in (False, True):
        assert case[(hicache, "device")]["cached_fraction"] >= 0.99


def test_table_lists_both_cases_and_the_capacity_change(record_path):
    table = record_path.with_suffix(".md").read_text()
    assert f"# HiCache A/B on {HOST}" in table
    rows = [line for line in table.splitlines() if line.startswith("| baseline") or line.startswith("| HiCache")]
    assert len(rows) == 6, table
    assert any(r.startswith("| baseline · cold") and "233,207" in r for r in rows), table
    assert any(r.startswith("| HiCache · cold") and "159,692" in r and "-31.5 %" in r for r in rows), table


def test_chart_is_a_png_of_readable_size(record_path):
    png = record_path.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 600, (width, height)
    assert height >= 300, (width, height)


def test_host_is_back_on_its_validated_config(host):
    unit = host.file(f"/etc/systemd/system/{UNIT}").content_string
    assert "--enable-hierarchical-cache" in unit
    assert "--hicache-size 8" in unit
    service = host.service(UNIT)
    assert service.is_running, journal(host)
    assert service.is_enabled
    info = server_info()
    assert info["enable_hierarchical_cache"] is True, journal(host)
    assert info["max_total_num_tokens"] == 159_692
    # The running process is the restored one: its command line has the HiCache args too.
    assert "--enable-hierarchical-cache" in info["launch_command"]
