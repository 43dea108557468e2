"""Verify playbooks/ab_benchmark.yml on a host site.yml deployed: what it wrote on the controller,
what it said when it failed, and the host it left behind.

The side effect ran the A/B against the simulator with the seed-shaped fixture model, so the
capacities are the seed's (233,207 tokens without HiCache, 159,692 with it: -31.5 %). The record,
the table and the chart are read on the controller. Before the A/B (and after an A/B that failed
midway) the side effect wrote the host's state (state-*.json in the ephemeral directory): the host
must serve exactly that release again, from a process that runs the release's own interpreter.
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
EPHEMERAL = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY") or Path(inventory).resolve().parents[1])
HOST = "ab-benchmark-1"
ADDRESS = "127.0.18.1"
PORT = 30004
URL = f"http://{ADDRESS}:{PORT}"
ROUTER = "http://127.0.18.250:30100"
UNIT = "sglang-main.service"
TIERS = ["cold", "device", "host"]
RELEASES = "/var/lib/sglang/main/releases"
# What must be as it was: the release pointers, its config, the files systemd reads, the releases.
SAME = ["active", "current", "previous", "config_hash", "unit_sha256", "env_sha256", "releases", "release_files"]


@pytest.fixture(scope="module")
def record_path() -> Path:
    records = sorted(REPORTS.glob(f"{HOST}-*.json"))
    assert len(records) == 1, f"expected one A/B record in {REPORTS}, found {records}"
    return records[0]


@pytest.fixture(scope="module")
def record(record_path) -> dict:
    return json.loads(record_path.read_text())


def state(label: str) -> dict:
    return json.loads((EPHEMERAL / f"state-{label}.json").read_text())


def get_json(url: str, key: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
        return json.load(answer)


def server_info() -> dict:
    # main serves with its own api key (inventory/group_vars/sglang_hosts/scenario.yml); the side
    # effect wrote the scenario's keys to secret-keys.json.
    key = json.loads((EPHEMERAL / "secret-keys.json").read_text())["instance"]
    return get_json(f"{URL}/get_server_info", key)


def journal(host) -> str:
    return host.run(f"journalctl -u {UNIT} -n 30 --no-pager").stdout


def state_now(host) -> dict:
    shown = host.check_output(f"systemctl show {UNIT} -p ActiveState -p MainPID")
    show = dict(line.split("=", 1) for line in shown.splitlines())
    current = host.check_output("readlink -f /var/lib/sglang/main/current")
    previous = host.run("readlink -e /var/lib/sglang/main/previous").stdout.strip()  # "" when there is none
    return {
        "active": show["ActiveState"],
        "main_pid": int(show["MainPID"]),
        "current": current,
        "previous": previous,
        "config_hash": json.loads(host.file(f"{current}/release.json").content_string)["config_hash"],
        "unit_sha256": host.file(f"/etc/systemd/system/{UNIT}").sha256sum,
        "env_sha256": host.file("/etc/sglang/main.env").sha256sum,
        "releases": sorted(host.check_output(f"find {RELEASES} -mindepth 1 -maxdepth 1 -type d").split()),
        "release_files": {
            Path(path).name: digest
            for digest, path in (line.split() for line in host.check_output(f"sha1sum {current}/*").splitlines())
        },
    }


def test_record_has_both_launches_and_every_tier(record):
    assert record["host"] == HOST
    assert (record["input_len"], record["repeats"], record["seed"]) == (48000, 3, 42)
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
    assert case[(False, "host")]["median_cached_tokens"] < 0.1 * 48000
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


def test_record_names_the_release_it_ran_on(record):
    # The A/B itself ran after the failed one, on the process that one left serving.
    before = state("after-failed")
    release = record["release"]
    assert release["dir"] == before["current"]
    assert release["config_hash"] == before["config_hash"]
    assert release["main_pid"] == before["main_pid"]
    # site.yml's unit runs the venv release by its own path; there is no /opt/sglang/current.
    assert release["python"].startswith("/opt/sglang/"), release
    assert "/current/" not in release["python"], release
    assert release["model"], release
    # The HiCache launch is the served release itself (same inventory, same interpreter and models).
    assert record["config_hashes"]["hicache"] == before["config_hash"]
    assert record["config_hashes"]["baseline"] != before["config_hash"]
    assert record["router"] == [f"left {URL}"]


def test_host_serves_the_release_it_was_found_on(host):
    before, now = state("before"), state_now(host)
    assert {key: now[key] for key in SAME} == {key: before[key] for key in SAME}, journal(host)
    assert now["active"] == "active"
    assert host.service(UNIT).is_enabled
    # The unit's MainPID is the process that listens on the instance's address ...
    # (test hosts share the machine's network: each sees the others' sockets, without process)
    listeners = host.check_output(f"ss -Hltnp 'sport = :{PORT}'").splitlines()
    mine = [line for line in listeners if f" {ADDRESS}:{PORT} " in line]
    assert len(mine) == 1, listeners
    assert f"pid={now['main_pid']}," in mine[0], mine
    # ... runs the release's own interpreter with the release's HiCache args ...
    cmdline = host.file(f"/proc/{now['main_pid']}/cmdline").content.split(b"\0")
    unit = host.file(f"/etc/systemd/system/{UNIT}").content_string
    assert f"ExecStart={cmdline[0].decode()} " in unit, (cmdline[:3], unit)
    assert b"--enable-hierarchical-cache" in cmdline
    assert [b"--hicache-size", b"10"] == cmdline[cmdline.index(b"--hicache-size") :][:2]
    # ... and serves: the server reports HiCache on and the HiCache capacity.
    info = server_info()
    assert info["enable_hierarchical_cache"] is True, journal(host)
    assert info["max_total_num_tokens"] == 159_692
    # The rollout's record of what it validated is the release that serves.
    validated = json.loads(host.file("/var/lib/hicache-fleet/validated.json").content_string)
    assert validated["instances"]["main"]["config_hash"] == now["config_hash"]


def test_host_is_back_in_the_router_healthy():
    workers = get_json(f"{ROUTER}/workers")["workers"]
    mine = [w for w in workers if w["url"] == URL]
    assert len(mine) == 1, workers
    assert mine[0]["is_healthy"] is True


def test_an_ab_failing_midway_restores_the_release_and_names_its_cause():
    before, after = state("before"), state("after-failed")
    assert {key: after[key] for key in SAME} == {key: before[key] for key in SAME}
    # The baseline had replaced the release: the process serving afterwards is a new one.
    assert after["main_pid"] != before["main_pid"]
    log = (EPHEMERAL / "failed-ab.log").read_text()
    assert f"The A/B on {HOST} failed at" in log, log[-3000:]
    cause = 'measure only": input_len 300000 exceeds the server\'s max_req_input_len'
    assert cause in log, log[-3000:]
    assert f"{HOST} serves release {Path(before['current']).name} again, as found" in log, log[-3000:]


def test_a_missing_interpreter_is_named_as_such():
    log = (EPHEMERAL / "missing-python.log").read_text()
    assert "interpreter /opt/sglang/current/bin/python not found on " + HOST in log, log[-3000:]
    assert "SGLang rejects" not in log
