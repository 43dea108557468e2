"""The gate's baseline and tier, end to end against the SGLang SIMULATOR (sim/): the rollout role's
filters (roles/rollout/filter_plugins/rollout.py) pick what a probe is held to and which tier it
proves; the probe module compares. Time is scaled ×0.01 as on the demo fleet, so a cold 32K prefill
takes ≈ 0.48 s, and the role's own defaults (max_regression, regression_slack_ms) are used."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.module_utils.sglang_probe_measure import ARGUMENT_SPEC
from plugins import load
from sim_server import HICACHE_ARGS, SEED_ARGS, SimServer, probe_once, sim_available

ROLE = Path(__file__).resolve().parents[2] / "roles" / "rollout"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
DEMO_SCALE = {"SGLANG_SIM_TIME_SCALE": "0.01"}
INPUT_LEN = 32000

needs_sim = pytest.mark.skipif(not sim_available(), reason="the simulator (sim/sglang_sim) is not in this tree")


def _load_filters():
    return load(ROLE / "filter_plugins" / "rollout.py")


filters = _load_filters()


def gate_params(params, url: str, instance: dict, **over):
    """The options the rollout's probe task passes, with the role's defaults for the regression."""
    options = {"url": url, "input_len": INPUT_LEN, "cold_output_len": 16, "warm_output_len": 4, "repeats": 1,
               "request_timeout": 120, "ready_timeout": 30, "flush_timeout": 10,
               "tier": filters.rollout_gate_tier(instance, DEFAULTS["rollout_probe_tier"]),
               "max_regression": DEFAULTS["rollout_probe_max_regression"],
               "regression_slack_ms": DEFAULTS["rollout_probe_regression_slack_ms"]}
    return params(**(options | over))


def record_of(result: dict, input_len: int = INPUT_LEN) -> dict:
    """The host's validation record (validated.json) after this result passed, as the role writes it."""
    item = {"name": "main", "unit": "sglang-main.service", "config_hash": "c0ffee"}
    summary = filters.rollout_gate_summary({**result, "item": item, "plan": {"input_len": input_len}})
    return {"instances": {"main": summary}}


HICACHE_ON = {"name": "main", "hicache": True}
HICACHE_OFF = {"name": "main", "hicache": False}


# --- the role's choices, as plain functions --------------------------------------------------------


def test_role_defaults_hold_hosts_to_a_baseline_with_margin():
    assert DEFAULTS["rollout_probe_use_baseline"] is True
    assert DEFAULTS["rollout_probe_tier"] == "auto"
    # a 10× slower prefill must land far beyond the limit, a healthy re-probe far inside it
    assert 1.5 <= 1 + DEFAULTS["rollout_probe_max_regression"] <= 3


def test_tier_follows_hicache_unless_set():
    assert filters.rollout_gate_tier({"hicache": True}) == "both"
    assert filters.rollout_gate_tier({"hicache": False}) == "device"
    assert filters.rollout_gate_tier({"hicache": "False"}) == "device"
    assert filters.rollout_gate_tier({"hicache": False}, "host") == "host"
    assert filters.rollout_gate_tier({"hicache": True}, "device") == "device"


def _probe_record(input_len: int, cold_ms: float, warm: dict | None = None, passed: bool = True) -> dict:
    return {"instances": {"main": {"probe": {
        "input_len": input_len, "cold": {"median_ttft_ms": cold_ms},
        "warm": {tier: {"median_ttft_ms": ms} for tier, ms in (warm or {}).items()},
        "gate": {"passed": passed}}}}}


def test_own_record_first_then_fleet_median_like_with_like():
    own = _probe_record(32000, 500.0, {"device": 5.0})
    hostvars = {
        "a": {"_rollout_gate_fleet_record": _probe_record(32000, 400.0, {"device": 4.0, "host": 9.0})},
        "b": {"_rollout_gate_fleet_record": _probe_record(32000, 600.0, {"device": 6.0})},
        "c": {"_rollout_gate_fleet_record": _probe_record(64000, 2000.0, {"device": 8.0})},
        "later": {},  # a host of a later batch has not read its record yet
        "me": {"_rollout_gate_fleet_record": own},
    }
    hosts = ["a", "b", "c", "later", "me"]
    mine = filters.rollout_gate_baseline(own, hostvars, hosts, "me", "main", 32000)
    assert mine["source"] == "the last validated result on this host"
    assert mine["cold"]["median_ttft_ms"] == 500.0
    fleet = filters.rollout_gate_baseline({"instances": {}}, hostvars, hosts, "me", "main", "32000")
    assert fleet["source"] == "the fleet median of 2 validated hosts (a, b)"
    assert fleet["input_len"] == 32000
    assert fleet["cold"]["median_ttft_ms"] == 500.0
    assert fleet["warm"] == {"device": {"median_ttft_ms": 5.0}, "host": {"median_ttft_ms": 9.0}}
    # no record at this prompt length: the shortest longer one (the module scales its cold TTFT)
    longer = filters.rollout_gate_baseline({"instances": {}}, hostvars, hosts, "me", "main", 16000)
    assert (longer["hosts"], longer["input_len"]) == (["a", "b"], 32000)
    # never a shorter one, never another instance, never a failed gate: nothing to hold to
    assert filters.rollout_gate_baseline({}, hostvars, hosts, "me", "main", 128000) == {}
    assert filters.rollout_gate_baseline({}, hostvars, hosts, "me", "other", 32000) == {}
    failed = {"a": {"_rollout_gate_fleet_record": _probe_record(32000, 400.0, passed=False)}}
    assert filters.rollout_gate_baseline({}, failed, ["a", "me"], "me", "main", 32000) == {}


# --- against the simulator ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def healthy(sim_model, tmp_path_factory):
    """A healthy HiCache server at the demo's time scale, and its first validated probe (both tiers)."""
    server = SimServer(sim_model, SEED_ARGS + HICACHE_ARGS, tmp_path_factory.mktemp("simlog") / "healthy.log",
                       **DEMO_SCALE)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def healthy_record(healthy):
    p = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    p.update(url=healthy.url, input_len=INPUT_LEN, cold_output_len=16, warm_output_len=4, repeats=1,
             request_timeout=120, ready_timeout=30, tier="both")
    result = probe_once(p)
    assert result["gate"]["passed"], result["gate"]["reasons"]
    return record_of(result)


@needs_sim
def test_healthy_reprobe_passes_against_its_own_record(healthy, healthy_record, params):
    baseline = filters.rollout_gate_baseline(healthy_record, {}, ["me"], "me", "main", INPUT_LEN)
    result = probe_once(gate_params(params, healthy.url, HICACHE_ON, baseline=baseline))
    gate = result["gate"]
    assert gate["passed"], gate["reasons"]
    compared = {c["name"]: c for c in gate["checks"] if c["name"].endswith(".max_regression")}
    assert set(compared) == {"cold.max_regression", "device.max_regression", "host.max_regression"}
    cold = compared["cold.max_regression"]
    print(f"healthy re-probe: cold {cold['value']:.1f} ms against a limit of {cold['limit']:.1f} ms "
          f"(recorded {gate['baseline']['cold_ms']:.1f} ms)")


@needs_sim
def test_ten_times_slower_prefill_fails_against_its_own_record_through_ansible(
        start_sim, healthy_record, params, ansible_run):
    slow = start_sim(SEED_ARGS + HICACHE_ARGS, SGLANG_SIM_FAULT="slow_prefill", **DEMO_SCALE)
    baseline = filters.rollout_gate_baseline(healthy_record, {}, ["me"], "me", "main", INPUT_LEN)
    args = gate_params(params, slow.url, HICACHE_ON, baseline=baseline)
    result = ansible_run({k: v for k, v in args.items() if v is not None and k != "gate"})
    assert result.get("failed") is True
    reasons = filters.rollout_gate_reasons(result)  # what the rollout report shows
    cold = [r for r in reasons if r.startswith("cold TTFT")]
    assert cold, reasons
    assert "× the last validated result on this host" in cold[0]
    assert f"max_regression {DEFAULTS['rollout_probe_max_regression']:g}" in cold[0]
    check = next(c for c in result["gate"]["checks"] if c["name"] == "cold.max_regression")
    ratio = check["value"] / result["gate"]["baseline"]["cold_ms"]
    print(f"slow prefill: {cold[0]}")
    assert ratio > 5, ratio
    assert result["msg"].startswith(f"the probe gate failed on {slow.url}")


@needs_sim
def test_ten_times_slower_prefill_fails_against_the_fleet_median(start_sim, healthy, healthy_record, params):
    # two other hosts validated at this prompt length (the healthy server probed again), one longer
    again = probe_once(gate_params(params, healthy.url, HICACHE_ON))
    assert again["gate"]["passed"], again["gate"]["reasons"]
    hostvars = {"gt-1": {"_rollout_gate_fleet_record": healthy_record},
                "gt-3": {"_rollout_gate_fleet_record": record_of(again)}}
    baseline = filters.rollout_gate_baseline({"instances": {}}, hostvars, ["gt-1", "gt-2", "gt-3"], "gt-2", "main",
                                             INPUT_LEN)
    assert baseline["source"] == "the fleet median of 2 validated hosts (gt-1, gt-3)"
    slow = start_sim(SEED_ARGS + HICACHE_ARGS, SGLANG_SIM_FAULT="slow_prefill", **DEMO_SCALE)
    result = probe_once(gate_params(params, slow.url, HICACHE_ON, baseline=baseline))
    reasons = result["gate"]["reasons"]
    assert not result["gate"]["passed"]
    assert any(r.startswith("cold TTFT") and "× the fleet median of 2 validated hosts (gt-1, gt-3)" in r
               for r in reasons), reasons


@needs_sim
def test_hicache_off_is_gated_on_the_device_tier(start_sim, healthy_record, params):
    off = start_sim(SEED_ARGS, **DEMO_SCALE)  # the same launch without the HiCache args
    baseline = filters.rollout_gate_baseline(healthy_record, {}, ["me"], "me", "main", INPUT_LEN)
    result = probe_once(gate_params(params, off.url, HICACHE_OFF, baseline=baseline))
    assert result["gate"]["passed"], result["gate"]["reasons"]
    assert list(result["warm"]) == ["device"]
    assert result["server"]["enable_hierarchical_cache"] is False
    # still held to the HiCache-on record: the cold read and the device tier are comparable
    names = {c["name"] for c in result["gate"]["checks"]}
    assert {"cold.max_regression", "device.max_regression"} <= names
    # an explicit tier is an override: host on a server without HiCache fails, naming the tier
    forced = gate_params(params, off.url, HICACHE_OFF, input_len=16000,
                         tier=filters.rollout_gate_tier(HICACHE_OFF, "host"))
    failed = probe_once(forced)
    assert not failed["gate"]["passed"]
    assert any("without --enable-hierarchical-cache" in r for r in failed["gate"]["reasons"])
