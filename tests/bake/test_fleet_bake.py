"""Issue 28 item 1: library/fleet_bake.py decides the bake from the fleet's Prometheus. A fake
Prometheus on 127.0.0.1 (conftest.FakePrometheus) answers the module's own PromQL with canned vectors;
the module runs through Ansible (delegated to localhost as the rollout will call it) and as functions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ansible.module_utils.fleet_bake import ARGUMENT_SPEC, THRESHOLD_SPEC, bake, build_queries, validate_params
from plugins import ROOT as REPO
from plugins import ansible_bin, ansible_env
from procs import free_port

BATCH = {"gpu-2": "10.0.0.2:30004", "gpu-3": "10.0.0.3:30004"}
OTHERS = ["10.0.0.1:30004", "10.0.0.4:30004"]
TOKEN = "bake-Token-7Qx"  # noqa: S105 (a test token)


def params(url: str, **over) -> dict:
    p = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    p["thresholds"] = {name: spec["default"] for name, spec in THRESHOLD_SPEC.items()}
    p.update(prometheus_url=url, window_s=600, min_requests=20, others=list(OTHERS),
             instances=[{"host": h, "targets": [t], "validated": {"cold_ttft_ms": 900.0, "warm_ttft_ms": 40.0}}
                        for h, t in BATCH.items()])
    p.update(over)
    return p


def healthy(requests=300.0, p50=0.05, p95=0.2, host_share=0.4, aborted=0.0) -> dict:
    return {"requests": requests, "p50": p50, "p95": p95, "prompt": requests * 1000,
            "device": requests * 1000 * 0.3, "host": requests * 1000 * host_share, "aborted": aborted,
            "resets": 0, "changes": 0, "up": 1}


def sample(value, **labels) -> dict:
    return {"metric": labels, "value": [1767000000.0, str(value)]}


def load(fake, p: dict, per_target: dict[str, dict], others_p50=0.05, others_p95=0.2) -> None:
    """Canned answers to exactly the queries the module builds for p."""
    q = build_queries(p)
    per = {"requests": "requests", "prompt_tokens": "prompt", "aborted": "aborted", "ttft_p50": "p50",
           "ttft_p95": "p95", "counter_resets": "resets", "up_changes": "changes", "up": "up"}
    for name, key in per.items():
        fake.answers[q[name]] = [sample(f[key], instance=t) for t, f in per_target.items()]
    fake.answers[q["cached_tokens"]] = [sample(f[tier], instance=t, cache_source=tier)
                                        for t, f in per_target.items() for tier in ("device", "host")]
    if "others_ttft_p95" in q:
        fake.answers[q["others_ttft_p50"]] = [sample(others_p50)]
        fake.answers[q["others_ttft_p95"]] = [sample(others_p95)]


def fleet(**batch_over) -> dict[str, dict]:
    figures = {t: healthy() for t in OTHERS}
    for host, target in BATCH.items():
        figures[target] = batch_over.get(host) or healthy()
    return figures


PLAYBOOK = """\
- name: Bake once
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Bake
      fleet_bake: {args}
      delegate_to: localhost
      register: bake_result
      ignore_errors: true
    - name: Save the result for the test
      ansible.builtin.copy:
        content: "{{{{ bake_result | to_json }}}}"
        dest: "{dest}"
        mode: "0600"
      check_mode: false
"""


def run_module(tmp_path: Path, args: dict, check: bool = False) -> dict:
    dest = tmp_path / f"bake-{len(list(tmp_path.glob('bake-*')))}.json"
    playbook = tmp_path / "bake.yml"
    playbook.write_text(PLAYBOOK.format(args=json.dumps(args), dest=dest))
    cmd = [ansible_bin("ansible-playbook"), "-i", "localhost,", str(playbook),
           "-e", json.dumps({"ansible_python_interpreter": sys.executable})]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, cwd=REPO, env=ansible_env(tmp_path), capture_output=True, text=True, timeout=180)
    assert dest.exists(), f"rc {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(dest.read_text())
    result["_output"] = proc.stdout + proc.stderr
    return result


def module_args(url: str, **over) -> dict:
    args = {"prometheus_url": url, "window_s": 600, "min_requests": 20, "others": OTHERS,
            "instances": [{"host": h, "targets": [t], "validated": {"cold_ttft_ms": 900.0, "warm_ttft_ms": 40.0}}
                          for h, t in BATCH.items()]}
    args.update(over)
    return args


def test_a_healthy_batch_passes_through_ansible_with_its_figures(tmp_path, fake_prometheus):
    p = params(fake_prometheus.url, bearer_token=TOKEN)
    load(fake_prometheus, p, fleet())
    result = run_module(tmp_path, module_args(fake_prometheus.url, bearer_token=TOKEN))
    assert not result.get("failed"), result["_output"]
    assert result["verdict"] == "passed"
    assert result["action"] == "continue"
    gpu2 = result["hosts"]["gpu-2"]
    assert gpu2["verdict"] == "passed"
    assert gpu2["figures"]["requests"] == 300.0
    assert gpu2["figures"]["ttft_p95_ms"] == 200.0
    assert gpu2["figures"]["ttft_p50_ms"] == 50.0
    assert gpu2["figures"]["tier_share"] == {"device": 0.3, "host": 0.4}
    assert gpu2["figures"]["error_rate"] == 0.0
    assert gpu2["validated"] == {"cold_ttft_ms": 900.0, "warm_ttft_ms": 40.0}
    assert result["others"]["ttft_p95_ms"] == 200.0
    assert result["others"]["requests"] == 600.0
    # every query went to /api/v1/query with the bearer token, and the token is in no output
    assert {r["path"] for r in fake_prometheus.requests} == {"/api/v1/query"}
    assert {r["authorization"] for r in fake_prometheus.requests} == {f"Bearer {TOKEN}"}
    assert len(fake_prometheus.requests) == len(result["queries"]) == 11
    assert TOKEN not in result["_output"]
    assert TOKEN not in json.dumps(result)


def test_a_host_with_five_times_the_others_p95_fails_naming_the_figure(fake_prometheus):
    p = params(fake_prometheus.url)
    load(fake_prometheus, p, fleet(**{"gpu-3": healthy(p95=1.0)}))
    result = bake(p)
    assert result["verdict"] == "failed"
    assert result["action"] == "rollback"
    assert result["failed_hosts"] == ["gpu-3"]
    assert result["hosts"]["gpu-2"]["verdict"] == "passed"
    gpu3 = result["hosts"]["gpu-3"]
    assert gpu3["figures"]["ttft_p95_vs_others"] == 5.0
    assert gpu3["reasons"] == ["TTFT p95 1000.0 ms is 5.00x the other hosts' 200.0 ms, above "
                               "max_ttft_p95_ratio_others 3"]
    assert "gpu-3 failed (TTFT p95 1000.0 ms is 5.00x" in result["msg"]


def test_the_p95_against_the_validated_cold_ttft_the_error_rate_restarts_and_the_host_tier(fake_prometheus):
    p = params(fake_prometheus.url, others=[])
    load(fake_prometheus, p, fleet(**{"gpu-2": healthy(p95=4.0)}))
    result = bake(p)
    assert result["hosts"]["gpu-2"]["reasons"] == [
        "TTFT p95 4000.0 ms is 4.44x its validated cold TTFT 900.0 ms, above max_ttft_p95_ratio_validated 3"]
    assert result["hosts"]["gpu-3"]["verdict"] == "passed"
    assert result["others"] is None

    p = params(fake_prometheus.url)
    broken = healthy(aborted=9.0, host_share=0.0)
    broken["resets"] = 1
    load(fake_prometheus, p, fleet(**{"gpu-2": broken}))
    reasons = bake(p)["hosts"]["gpu-2"]["reasons"]
    assert reasons == [
        "restarts 1 in 600 s (counter resets, scrape up/down changes), more than max_restarts 0",
        "error rate 3.00% (9 aborted of 300 requests), above max_error_rate 1.00%",
        "host-tier share 0.0% of prompt tokens against 40.0% on the other hosts, below min_tier_share_ratio "
        "0.5 of theirs"]


def test_too_few_requests_are_inconclusive_and_no_traffic_decides_the_action(tmp_path, fake_prometheus):
    p = params(fake_prometheus.url)
    load(fake_prometheus, p, fleet(**{"gpu-2": healthy(requests=5.0)}))
    for no_traffic, action in (("pass", "continue"), ("hold", "hold"), ("warm", "warm")):
        result = bake({**p, "no_traffic": no_traffic})
        assert result["verdict"] == "inconclusive"
        assert result["action"] == action
        assert result["inconclusive_hosts"] == ["gpu-2"]
        assert result["hosts"]["gpu-2"]["reasons"] == [
            "requests 5 in 600 s, fewer than min_requests 20: too little traffic to judge"]
        assert result["msg"].endswith(f"; no_traffic {no_traffic}: {action}")
    # a restart is conclusive without traffic
    restarted = healthy(requests=5.0)
    restarted["changes"] = 2
    load(fake_prometheus, p, fleet(**{"gpu-2": restarted}))
    assert bake(p)["hosts"]["gpu-2"]["verdict"] == "failed"


def test_prometheus_down_is_inconclusive_with_the_error_not_a_failure(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = run_module(tmp_path, module_args(url, no_traffic="hold", timeout_s=2))
    assert not result.get("failed"), result["_output"]
    assert result["verdict"] == "inconclusive"
    assert result["action"] == "hold"
    assert result["error"].startswith(f"Prometheus {url} not reached: ")
    assert "Connection refused" in result["error"]
    assert result["hosts"]["gpu-2"] == {"verdict": "inconclusive", "figures": {}, "reasons": [result["error"]],
                                        "validated": {"cold_ttft_ms": 900.0, "warm_ttft_ms": 40.0}}


def test_a_refused_query_and_a_host_without_series_are_inconclusive(fake_prometheus):
    p = params(fake_prometheus.url)
    result = bake(p)  # the fake knows no query: every vector empty
    assert result["verdict"] == "inconclusive"
    assert result["hosts"]["gpu-2"]["reasons"][0].startswith("Prometheus has no series for 10.0.0.2:30004")
    p = params(fake_prometheus.url.replace("127.0.0.1", "user:pw-Secret@127.0.0.1") + "/nothing")
    result = bake(p)
    assert result["error"].startswith(f"Prometheus {fake_prometheus.url}/nothing answered HTTP 404")
    assert "pw-Secret" not in json.dumps(result)


def test_check_mode_returns_the_queries_and_sends_nothing(tmp_path, fake_prometheus):
    result = run_module(tmp_path, module_args(fake_prometheus.url), check=True)
    assert result["verdict"] == "not_run"
    assert fake_prometheus.requests == []
    assert result["queries"]["ttft_p95"] == (
        'histogram_quantile(0.95, sum by (instance, le) (rate(sglang:time_to_first_token_seconds_bucket'
        '{job="sglang",instance=~"10\\\\.0\\\\.0\\\\.2:30004|10\\\\.0\\\\.0\\\\.3:30004|10\\\\.0\\\\.0\\\\.1:30004|'
        '10\\\\.0\\\\.0\\\\.4:30004"}[600s])))')
    assert result["msg"] == f"check mode: would send 11 queries to {fake_prometheus.url}; nothing sent"


def test_bad_options_fail_before_any_query_naming_the_option(tmp_path, fake_prometheus):
    args = module_args(fake_prometheus.url, window_s=0, others=[BATCH["gpu-2"]],
                       thresholds={"max_ttft_p95_ratio_others": 0.5})
    result = run_module(tmp_path, args)
    assert result["failed"]
    assert fake_prometheus.requests == []
    assert "window_s must be a whole number of seconds of at least 1 (got 0)" in result["msg"]
    assert "others: target 10.0.0.2:30004 is in the batch (gpu-2)" in result["msg"]
    assert "thresholds.max_ttft_p95_ratio_others must be at least 1 (got 0.5)" in result["msg"]
    assert validate_params(params("ftp://x")) == [
        "prometheus_url must be the Prometheus base URL, http(s)://host:port (got 'ftp://x')."]
