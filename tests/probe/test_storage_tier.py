"""Issue 27 item 2: the probe proves the storage (L3) tier, with fake servers that report
cached_tokens_details.storage (probe_fakes.FakeServer with storage_backend)."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.sglang_probe_client import SGLangClient
from ansible.module_utils.sglang_probe_gate import evaluate_gate
from ansible.module_utils.sglang_probe_measure import plan_steps, run_probe, tiers_of, validate_params
from ansible.module_utils.sglang_probe_report import build_report, round_line, summary_line
from probe_fakes import FakeServer

# Seconds per uncached token of the fakes whose gate must pass: a cold read of 0.5 s over 512 tokens,
# not the fakes' default 0.1 s, so that a loaded machine's scheduling delay stays far under the
# gate's TTFT ratio.
SLOW = 0.001


def probe(server: FakeServer, p: dict, lines: list | None = None) -> dict:
    client = SGLangClient(server.url, None, p["request_timeout"])
    out = lines if lines is not None else []
    result = run_probe(p, client, on_line=out.append)
    result["gate"] = evaluate_gate(result, p)
    return result


def storage_params(params, **over):
    base = dict(tier="all", storage_write_wait_s=0.0, max_warm_cold_ratio=0.9)
    base.update(over)
    return params(**base)


def test_tiers_of_all_adds_storage_and_both_stays():
    assert tiers_of("all") == ["device", "host", "storage"]
    assert tiers_of("both") == ["device", "host"]
    assert tiers_of("storage") == ["storage"]


def test_storage_tier_is_read_back_from_storage_after_a_flush(params):
    p = storage_params(params)
    # A cold read of 0.5 s, as below: a loaded machine held a 0.1 s fake's warm device read for 124 ms
    # against a 109 ms cold read (a fresh-clone run of .ci/run, 2026-12-07).
    with FakeServer(storage_backend="file", capacity=1024, s_per_token=SLOW) as server:
        result = probe(server, p)
    warm = result["warm"]["storage"]
    assert warm["median_storage_cached_tokens"] == 511
    assert warm["median_device_cached_tokens"] == 0
    assert warm["median_host_cached_tokens"] == 0
    assert result["cold"]["median_cached_tokens"] == 0
    assert result["storage"]["measured"] is True
    assert result["storage"]["backend"] == "file"
    names = {c["name"]: c for c in result["gate"]["checks"]}
    assert names["storage.min_storage_cached_fraction"]["passed"]
    assert "storage.max_warm_cold_ratio" in names
    assert "storage.parity" in names
    assert result["gate"]["passed"], result["gate"]["reasons"]
    # the round: flush, cold, device, fillers, host, then a second flush before the storage read
    flushes = [r for r in server.requests if r[1].startswith("/flush_cache")]
    assert len(flushes) == 2
    line = summary_line(result)
    assert "warm storage TTFT" in line
    assert "storage 511" in line
    report = build_report(result, p)
    assert report["warm"]["storage"]["cache_report"]["storage_cached_tokens"] == 511
    assert report["storage"]["backend"] == "file"
    json.dumps(report)


def test_storage_that_gives_nothing_back_fails_the_gate_naming_the_option(params):
    p = storage_params(params)
    with FakeServer(storage_backend="file", capacity=1024, storage_hits=False) as server:
        result = probe(server, p)
    assert not result["gate"]["passed"]
    reason = next(r for r in result["gate"]["reasons"] if "min_storage_cached_fraction" in r)
    assert "storage-cached tokens 0 < 409" in reason
    assert "file storage tier" in reason


def test_cold_reads_are_cold_although_storage_keeps_the_last_run(params):
    """/flush_cache leaves L3: a second run must not read its cold prompt back from storage."""
    p = storage_params(params, repeats=2)
    shared: set = set()
    # SLOW: the gate's TTFT ratio must pass too, and a loaded machine's scheduler once held a 0.1 s
    # fake's warm read for 150 ms (warm 150.6 ms against cold 105.9 ms, a fresh-clone run of .ci/run).
    with FakeServer(storage_backend="file", capacity=1024, storage=shared, s_per_token=SLOW) as server:
        first = probe(server, p)
        second = probe(server, p)
    for result in (first, second):
        assert [r["cached_tokens"] for r in result["cold"]["runs"]] == [0, 0]
        assert result["gate"]["passed"], result["gate"]["reasons"]


def test_restart_reread_shows_what_came_back_from_storage(params):
    p = storage_params(params, storage_reread_first=True, min_restart_storage_fraction=0.9)
    shared: set = set()
    lines: list = []
    with FakeServer(storage_backend="file", capacity=1024, storage=shared, s_per_token=SLOW) as before:
        first = probe(before, p)
    # the first run ever: nothing in storage, the gate on the restart re-read fails and says so
    assert first["restart_hit"]["storage_cached_tokens"] == 0
    assert any("restart re-read: 0 tokens came back from storage < 460" in r for r in first["gate"]["reasons"])
    # restarted, same L3
    with FakeServer(storage_backend="file", capacity=1024, storage=shared, s_per_token=SLOW) as after:
        second = probe(after, p, lines)
    hit = second["restart_hit"]
    assert hit["storage_cached_tokens"] == 511
    assert hit["cached_tokens"] == 511
    assert hit["device_cached_tokens"] == 0
    assert hit["ttft_ms"] > 0
    assert second["gate"]["passed"], second["gate"]["reasons"]
    # sent first, before any flush
    assert after.requests[3] == ("POST", "/generate")
    assert after.requests.index(("POST", "/flush_cache")) > 3
    assert any(line.startswith("restart re-read: 511 of 512 tokens from storage") for line in lines)
    assert "restart re-read 511 of 512 tokens from storage" in summary_line(second)
    # a restart onto an empty directory (the identity changed): nothing comes back
    with FakeServer(storage_backend="file", capacity=1024) as fresh:
        third = probe(fresh, p)
    assert third["restart_hit"]["storage_cached_tokens"] == 0
    assert not third["gate"]["passed"]


def test_tier_all_without_a_backend_measures_device_and_host_and_says_so(params):
    p = storage_params(params, storage_reread_first=True)
    with FakeServer(capacity=1024, s_per_token=SLOW) as server:
        result = probe(server, p)
    assert sorted(result["warm"]) == ["device", "host"]
    assert result["storage"]["measured"] is False
    assert "without a storage backend" in result["storage"]["note"]
    assert "restart_hit" not in result
    assert result["gate"]["passed"], result["gate"]["reasons"]
    assert "storage tier not measured" in summary_line(result)


def test_tier_storage_without_a_backend_fails_the_gate(params):
    p = storage_params(params, tier="storage")
    with FakeServer(capacity=1024) as server:
        result = probe(server, p)
    assert not result["gate"]["passed"]
    assert any("--hicache-storage-backend" in r for r in result["gate"]["reasons"])


def test_restart_gate_without_a_backend_fails_naming_it(params):
    p = storage_params(params, storage_reread_first=True, min_restart_storage_fraction=0.5)
    with FakeServer(capacity=1024) as server:
        result = probe(server, p)
    assert any("restart re-read was not sent" in r for r in result["gate"]["reasons"])


def test_options_off_keep_the_verdict_and_the_requests(params):
    """Without storage options a server with a storage backend is probed as before, plus fresh prompts."""
    p = params(tier="both", max_warm_cold_ratio=0.9)
    with FakeServer(capacity=1024) as plain:
        before = probe(plain, p)
    with FakeServer(capacity=1024, storage_backend="file") as l3:
        after = probe(l3, p)
    assert sorted(after["warm"]) == ["device", "host"]
    assert "restart_hit" not in after
    assert [c["name"] for c in after["gate"]["checks"]] == [c["name"] for c in before["gate"]["checks"]]
    assert [r[1] for r in l3.requests] == [r[1] for r in plain.requests]
    assert "storage" not in before


def test_storage_options_are_checked_by_name(params):
    errors = " ".join(validate_params(params(min_restart_storage_fraction=0.5)))
    assert "min_restart_storage_fraction" in errors
    assert "storage_reread_first" in errors
    errors = " ".join(validate_params(params(min_storage_cached_fraction=1.5, storage_write_wait_s=-1.0)))
    assert "min_storage_cached_fraction must be between 0 and 1" in errors
    assert "storage_write_wait_s must be" in errors


def test_plan_and_round_line_name_the_storage_steps(params):
    steps = plan_steps(params(tier="all", storage_reread_first=True))
    assert any("restart re-read" in s for s in steps)
    assert any("storage (only when the server reports hicache_storage_backend)" in s for s in steps)
    line = round_line(1, 1, {"cold": {"ttft_s": 1.0, "cached_tokens": 0},
                             "storage": {"ttft_s": 0.1, "cached_tokens": 500, "storage_cached_tokens": 500}})
    assert "warm storage TTFT 100 ms, 0.1000 of cold (cached 500, from storage 500)" in line


@pytest.mark.parametrize("tier", ["storage", "all"])
def test_module_accepts_the_new_tiers(params, tier):
    assert not validate_params(params(tier=tier))
