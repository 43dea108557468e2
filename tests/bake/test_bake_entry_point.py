"""Issue 28 item 1: the rollout role's `bake` entry point (roles/rollout/tasks/bake.yml) as the batch
play runs it, on localhost against the fake Prometheus: a batch of two hosts (gpu-2, gpu-3) beside
two others (gpu-1, gpu-4). One fleet_bake call for the batch; a host beyond a threshold fails (the
play's rescue gets the bake's reason) while the other keeps its record with its bake; too little
traffic with rollout_bake_no_traffic=hold writes paused.json with the bake and the report says
"held"; check mode sends no query and the record says so."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from plugins import ROOT as REPO
from plugins import ansible_bin, ansible_env
from test_fleet_bake import OTHERS, fleet, healthy, load, params

PLAYBOOK = """\
- name: A batch back in the router, baked
  hosts: batch
  gather_facts: false
  tasks:
    - name: Bake, or roll back
      block:
        - name: Bake
          ansible.builtin.include_role:
            name: rollout
            tasks_from: bake
      rescue:
        - name: The rescue gets why
          ansible.builtin.copy:
            content: "{{ ansible_failed_result.msg }}"
            dest: "{{ rollout_run_dir }}/rescued-{{ inventory_hostname }}"
            mode: "0600"
          delegate_to: localhost
"""

RECORD = {"instances": {"main": {"config_hash": "a" * 64, "probe": {
    "cold": {"median_ttft_ms": 900.0}, "warm": {"host": {"median_ttft_ms": 40.0}}}}}}


def run_bake(tmp_path: Path, url: str, check: bool = False, **extra) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / "run"
    (run_dir / "hosts").mkdir(parents=True)
    host_vars = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "sglang_hosts": {"hosts": {f"gpu-{n}": {"ansible_host": f"10.0.0.{n}"} for n in (1, 2, 3, 4)},
                         "vars": host_vars},
        "batch": {"hosts": {"gpu-2": None, "gpu-3": None},
                  # What the gate left on each host of the batch (tasks/main.yml, report.yml).
                  "vars": {"_rollout_gate_fleet_record": RECORD,
                           "_rollout_host_record": {"host": "{{ inventory_hostname }}", "verdict": "passed",
                                                    "probe": {}, "instances": []}}},
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "bake.yml").write_text(PLAYBOOK)
    settings = {"rollout_run_dir": str(run_dir), "rollout_bake_s": 1, "rollout_prometheus_url": url,
                "ansible_python_interpreter": sys.executable, **extra}
    cmd = [ansible_bin("ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "bake.yml"),
           "-e", json.dumps(settings)] + (["--check"] if check else [])
    done = subprocess.run(cmd, cwd=REPO, env=ansible_env(tmp_path), capture_output=True, text=True, timeout=300,
                          check=False)
    return done, run_dir


def batch_params(url: str) -> dict:
    return params(url, window_s=1, others=list(OTHERS),
                  instances=[{"host": h, "targets": [f"10.0.0.{h[-1]}:30004"],
                              "validated": {"cold_ttft_ms": 900.0, "warm_ttft_ms": 40.0}} for h in ("gpu-2", "gpu-3")])


def bake_of(run_dir: Path, host: str) -> dict:
    return json.loads((run_dir / "hosts" / f"{host}.json").read_text())["bake"]


def test_a_host_beyond_the_thresholds_fails_into_the_rescue_the_other_keeps_its_record(tmp_path, fake_prometheus):
    load(fake_prometheus, batch_params(fake_prometheus.url), fleet(**{"gpu-3": healthy(p95=1.0)}))
    done, run_dir = run_bake(tmp_path, fake_prometheus.url)
    assert done.returncode == 0, done.stdout[-3000:]
    # One bake for the batch (run_once): each of its queries sent once.
    queries = [r["query"] for r in fake_prometheus.requests]
    assert len(queries) == len(set(queries)) == 11
    assert not (run_dir / "rescued-gpu-2").exists()
    assert (run_dir / "rescued-gpu-3").read_text() == (
        "bake failed over 1 s: TTFT p95 1000.0 ms is 5.00x the other hosts' 200.0 ms, above "
        "max_ttft_p95_ratio_others 3")
    passed = bake_of(run_dir, "gpu-2")
    assert (passed["verdict"], passed["outcome"], passed["figures"]["ttft_p95_ms"]) == ("passed", "passed", 200.0)
    assert passed["validated"] == {"cold_ttft_ms": 900.0, "warm_ttft_ms": 40.0}
    # The failed host's record is the rollback's to write (tasks/rollback.yml), with its bake.
    assert not (run_dir / "hosts" / "gpu-3.json").exists()
    assert not (run_dir / "paused.json").exists()


@pytest.mark.parametrize("no_traffic", ["hold", "pass"])
def test_too_little_traffic_follows_rollout_bake_no_traffic(tmp_path, fake_prometheus, no_traffic):
    load(fake_prometheus, batch_params(fake_prometheus.url),
         {**fleet(), "10.0.0.2:30004": healthy(requests=3.0), "10.0.0.3:30004": healthy(requests=2.0)})
    done, run_dir = run_bake(tmp_path, fake_prometheus.url, rollout_bake_no_traffic=no_traffic)
    assert done.returncode == 0, done.stdout[-3000:]
    assert not list(run_dir.glob("rescued-*"))
    bake = bake_of(run_dir, "gpu-2")
    assert bake["verdict"] == "inconclusive"
    assert bake["reasons"] == ["requests 3 in 1 s, fewer than min_requests 20: too little traffic to judge"]
    if no_traffic == "hold":
        assert bake["outcome"] == "inconclusive: held (rollout_bake_no_traffic=hold), the run stops after this batch"
        paused = json.loads((run_dir / "paused.json").read_text())
        assert paused["after_batch"] == 1
        assert paused["bake"]["hosts"] == ["gpu-2", "gpu-3"]
        assert paused["bake"]["no_traffic"] == "hold"
        # The run's end renders the report again (callback_plugins/rollout_outcome.py): it says held.
        subprocess.run([sys.executable, str(REPO / "roles/rollout/files/fleet_report.py"), "rollout", str(run_dir)],
                       check=True, capture_output=True)
        report = json.loads((run_dir / "rollout.json").read_text())
        assert report["run"]["verdict"].startswith("held after batch 1: bake inconclusive on gpu-2, gpu-3 "
                                                   "(rollout_bake_no_traffic=hold: too little traffic to judge)")
    else:
        assert bake["outcome"] == "inconclusive: passed by rollout_bake_no_traffic=pass"
        assert not (run_dir / "paused.json").exists()
        assert "passed by rollout_bake_no_traffic=pass" in (run_dir / "rollout.md").read_text()


def test_check_mode_sends_no_query_and_says_so(tmp_path, fake_prometheus):
    done, run_dir = run_bake(tmp_path, fake_prometheus.url, check=True)
    assert done.returncode == 0, done.stdout[-3000:]
    assert fake_prometheus.requests == []
    assert bake_of(run_dir, "gpu-2")["outcome"] == "not run (check mode: no query sent)"
    assert "check mode: would send 11 queries" in done.stdout


class _Switch(dict):
    """The fake's answers: the first bake's (its 11 queries), then the second's."""

    def __init__(self, fake, first: dict, then: dict) -> None:
        super().__init__()
        self.fake, self.first, self.then = fake, first, then

    def get(self, key, default=None):
        return (self.first if len(self.fake.requests) <= 11 else self.then).get(key, default)


def test_warm_sends_the_warm_set_as_traffic_then_the_second_bake_decides(tmp_path, fake_prometheus):
    """rollout_bake_no_traffic=warm: the warm set goes to each gated instance (the SGLang-API
    SIMULATOR here), repeated up to rollout_bake_min_requests, one more window, one more bake."""
    sys.path.insert(0, str(REPO / "tests" / "probe"))
    from sim_server import HICACHE_ARGS, SEED_ARGS, SimServer, sim_available, write_fixture_model

    if not sim_available():
        pytest.skip("the simulator (sim/sglang_sim) is not in this tree")
    sim = SimServer(write_fixture_model(tmp_path / "model"), [*SEED_ARGS, *HICACHE_ARGS, "--enable-metrics"],
                    tmp_path / "sim.log")
    try:
        p = batch_params(fake_prometheus.url)
        load(fake_prometheus, p, {**fleet(), "10.0.0.2:30004": healthy(requests=1.0),
                                  "10.0.0.3:30004": healthy(requests=1.0)})
        first = dict(fake_prometheus.answers)
        fake_prometheus.answers = {}
        load(fake_prometheus, p, fleet())
        fake_prometheus.answers = _Switch(fake_prometheus, first, dict(fake_prometheus.answers))
        warm = tmp_path / "prompt.txt"
        warm.write_text("You are a careful assistant for the fleet. " * 40)
        port = int(sim.url.rsplit(":", 1)[1])
        done, run_dir = run_bake(
            tmp_path, fake_prometheus.url, rollout_bake_no_traffic="warm", rollout_warm_set=[str(warm)],
            rollout_bake_min_requests=3, rollout_record_path=str(tmp_path / "state" / "validated.json"),
            _rollout_gate_targets=[{"name": "main", "bind": "127.0.0.1", "port": port, "unit": "sglang-main.service"}])
        assert done.returncode == 0, done.stdout[-3000:]
        with urllib.request.urlopen(f"{sim.url}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
    finally:
        sim.stop()
    assert len(fake_prometheus.requests) == 22  # two bakes
    # Three sends of the one file per host (min_requests 3), both hosts on this one simulator.
    sent = sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith("sglang:num_requests_total"))
    assert sent == 6
    bake = bake_of(run_dir, "gpu-2")
    assert bake["verdict"] == "passed"
    assert bake["warmed"] is True
    assert bake["outcome"] == "passed (after the warm set was sent as traffic)"
