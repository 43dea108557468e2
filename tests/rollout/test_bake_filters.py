"""Issue 28 item 1, the bake's wiring (roles/rollout filter_plugins/rollout_bake.py): its settings
checked before any host changes, the batch's targets exactly as roles/monitoring scrapes them, the
validated figures from the gate's record, the decision after a warm-up, each host's record for the
report; and the report's bake section (roles/rollout/files/fleet_report.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plugins import load

bake_filters = load("roles/rollout/filter_plugins/rollout_bake.py", "rollout_bake_filters")
endpoints = load("roles/monitoring/filter_plugins/fleet_endpoints.py", "monitoring_fleet_endpoints")
fleet_report = load("roles/rollout/files/fleet_report.py", "fleet_report_bake")


def record(cold: float, warm: float) -> dict:
    return {"instances": {"main": {"config_hash": "a" * 64, "probe": {
        "cold": {"median_ttft_ms": cold}, "warm": {"host": {"median_ttft_ms": warm}}}}}}


HOSTVARS = {
    "gpu-1": {"ansible_host": "10.0.0.1", "_rollout_gate_fleet_record": record(500.0, 20.0)},
    "gpu-2": {"ansible_host": "10.0.0.2", "rollout_router_worker_host": "gpu-2.lan",
              "sglang_service_instances": [{"name": "a", "port": 30004}, {"name": "b", "port": 30005}],
              "_rollout_gate_fleet_record": {"instances": {
                  "a": record(400.0, 15.0)["instances"]["main"], "b": record(600.0, 25.0)["instances"]["main"]}}},
    "gpu-3": {},
}


def test_targets_are_the_monitoring_roles_instance_labels():
    """The bake asks Prometheus for the label values roles/monitoring gives each instance."""
    hosts = list(HOSTVARS)
    scraped = [e["target"] for e in endpoints.fleet_endpoints(HOSTVARS, hosts)]
    ours = [t for h in hosts for t in bake_filters.rollout_bake_targets(HOSTVARS, h)]
    assert ours == scraped == ["10.0.0.1:30004", "gpu-2.lan:30004", "gpu-2.lan:30005", "gpu-3:30004"]


def test_instances_carry_the_gates_figures_and_others_are_the_rest_of_the_fleet():
    instances = bake_filters.rollout_bake_instances(HOSTVARS, ["gpu-2"])
    # A host with several instances is held to its slowest validated cold read.
    assert instances == [{"host": "gpu-2", "targets": ["gpu-2.lan:30004", "gpu-2.lan:30005"],
                          "validated": {"cold_ttft_ms": 600.0, "warm_ttft_ms": 25.0}}]
    assert bake_filters.rollout_bake_others(HOSTVARS, list(HOSTVARS), ["gpu-2"]) == ["10.0.0.1:30004", "gpu-3:30004"]
    assert bake_filters.rollout_bake_instances(HOSTVARS, ["gpu-3"])[0]["validated"] == {}


@pytest.mark.parametrize(("args", "wrong"), [
    ((0,), []),
    ((0, ""), []),  # off: nothing else is asked
    ((30, "http://prom:9090"), []),
    (("30", "https://u:p@prom/prefix", "warm", 5, {"max_restarts": 1}, ["w.txt"]), []),
    ((30, ""), ["rollout_prometheus_url"]),
    ((30, "prom:9090"), ["rollout_prometheus_url"]),
    ((-1,), ["rollout_bake_s"]),
    ((3601,), ["rollout_bake_s"]),
    (("soon",), ["rollout_bake_s"]),
    ((True,), ["rollout_bake_s"]),
    ((30, "http://prom:9090", "wait"), ["rollout_bake_no_traffic"]),
    ((30, "http://prom:9090", "warm", 20, {}, []), ["rollout_warm_set"]),
    ((30, "http://prom:9090", "hold", 0), ["rollout_bake_min_requests"]),
    ((30, "http://prom:9090", "hold", 20, {"max_ttft_p99": 2}), ["rollout_bake_thresholds.max_ttft_p99"]),
    ((30, "http://prom:9090", "hold", 20, {"max_error_rate": "a lot"}), ["rollout_bake_thresholds.max_error_rate"]),
    ((30, "http://prom:9090", "hold", 20, {"max_restarts": -1}), ["rollout_bake_thresholds.max_restarts"]),
    ((30, "http://prom:9090", "hold", 20, ["max_restarts"]), ["rollout_bake_thresholds"]),
])
def test_settings_are_refused_naming_the_variable(args, wrong):
    errors = bake_filters.rollout_bake_errors(*args)
    assert len(errors) == len(wrong), errors
    for name, error in zip(wrong, errors, strict=True):
        assert name in error, error


def test_a_prometheus_url_with_credentials_is_never_shown():
    (error,) = bake_filters.rollout_bake_errors(30, "ftp://ops:s3cret@prom:9090")
    assert "s3cret" not in error
    assert "(credentials)@" in error


RESULT = {
    "verdict": "failed", "action": "rollback", "no_traffic": "hold", "window_s": 20, "error": None,
    "msg": "bake failed over 20 s: gpu-2 failed (TTFT p95 ...)",
    "hosts": {
        "gpu-1": {"verdict": "passed", "reasons": [], "validated": {"cold_ttft_ms": 500.0},
                  "figures": {"requests": 40.0, "ttft_p50_ms": 60.0, "ttft_p95_ms": 190.0, "restarts": 0,
                              "tier_share": {"device": 0.4, "host": 0.3}, "error_rate": 0.0, "per_target": {}}},
        "gpu-2": {"verdict": "failed", "reasons": ["TTFT p95 1950.0 ms is 10.26x the other hosts' 190.0 ms"],
                  "validated": {"cold_ttft_ms": 400.0},
                  "figures": {"requests": 35.0, "ttft_p50_ms": 1500.0, "ttft_p95_ms": 1950.0, "restarts": 0,
                              "tier_share": {"device": 0.4, "host": 0.3}, "error_rate": 0.0}},
    },
    "others": {"requests": 80.0, "ttft_p95_ms": 190.0, "tier_share": {"device": 0.4}},
}


def test_each_hosts_record_says_what_the_run_did():
    failed = bake_filters.rollout_bake_host(RESULT, "gpu-2")
    assert failed["verdict"] == "failed"
    assert failed["outcome"] == "failed: rolled back, the run stops"
    assert failed["figures"]["ttft_p95_ms"] == 1950.0
    assert "per_target" not in failed["figures"]
    assert failed["others"]["ttft_p95_ms"] == 190.0
    assert bake_filters.rollout_bake_failure(failed) == (
        "bake failed over 20 s: TTFT p95 1950.0 ms is 10.26x the other hosts' 190.0 ms")
    # The other host of a failed batch passed its own bake.
    assert bake_filters.rollout_bake_host(RESULT, "gpu-1")["outcome"] == "passed"
    held = bake_filters.rollout_bake_host({"verdict": "inconclusive", "action": "hold", "no_traffic": "hold",
                                           "hosts": {"gpu-1": {"verdict": "inconclusive"}}}, "gpu-1")
    assert held["outcome"] == "inconclusive: held (rollout_bake_no_traffic=hold), the run stops after this batch"
    passed = bake_filters.rollout_bake_host({"verdict": "inconclusive", "action": "continue", "no_traffic": "pass",
                                             "hosts": {"gpu-1": {"verdict": "inconclusive"}}}, "gpu-1")
    assert passed["outcome"] == "inconclusive: passed by rollout_bake_no_traffic=pass"
    checked = bake_filters.rollout_bake_host({"verdict": "not_run", "action": "continue"}, "gpu-1")
    assert checked["outcome"] == "not run (check mode: no query sent)"


def test_a_second_bake_after_the_warm_set_decides_and_never_warms_twice():
    first = {"verdict": "inconclusive", "action": "warm", "msg": "too few"}
    assert bake_filters.rollout_bake_final(first) == first
    assert bake_filters.rollout_bake_final(first, {"skipped": True, "changed": False}) == first
    again = bake_filters.rollout_bake_final(first, {"verdict": "passed", "action": "continue"})
    assert (again["verdict"], again["action"], again["warmed"]) == ("passed", "continue", True)
    still = bake_filters.rollout_bake_final(first, {"verdict": "inconclusive", "action": "warm"})
    assert still["action"] == "hold"
    assert bake_filters.rollout_bake_host(still, "x")["outcome"] == (
        "inconclusive after the warm set was sent as traffic: held (rollout_bake_no_traffic=hold)")


def test_the_report_shows_the_bake_beside_the_probe(tmp_path: Path):
    (tmp_path / "hosts").mkdir()
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r1", "inventory": "inv", "hosts": ["gpu-1", "gpu-2"]}))
    probe = {"cold": {"median_ttft_ms": 400.0}, "warm": {"host": {"median_ttft_ms": 15.0}}, "gate": {"passed": True}}
    for order, (host, verdict) in enumerate([("gpu-1", "passed"), ("gpu-2", "rolled back")]):
        (tmp_path / "hosts" / f"{host}.json").write_text(json.dumps({
            "host": host, "order": order, "verdict": verdict, "probe": probe,
            "bake": bake_filters.rollout_bake_host(RESULT, host)}))
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    md = (tmp_path / "rollout.md").read_text()
    assert "## Bake (live traffic after the batch rejoined)" in md
    assert ("| gpu-2 | failed: rolled back, the run stops | 1.50 s / 1.95 s | 400.0 ms / 15.0 ms | 190.0 ms | "
            "device 40.0 % / host 30.0 % | 0.0 % (0) | 0 | 35 | 20 s | hold |") in md
    assert "| gpu-1 | passed | 60.0 ms / 190.0 ms |" in md
    assert "- **gpu-2**: TTFT p95 1950.0 ms is 10.26x the other hosts' 190.0 ms" in md
    report = json.loads((tmp_path / "rollout.json").read_text())
    assert report["hosts"][1]["bake"]["figures"]["ttft_p95_ms"] == 1950.0
