"""Answer parity (issue 25 item 1): the warm read must answer what the cold read answered.

The comparison and its gate check as plain functions, the stream's ids and logprobs as SGLang 0.5.23
sends them (whole or incremental), the prompt (a random block repeated), and the probe against the
fake server of probe_fakes.py: healthy, answering otherwise when the prompt was cached, without ids,
without logprobs."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.sglang_probe_client import (
    SGLangClient,
    accumulate_output,
    generate_body,
    repeated_block_ids,
)
from ansible.module_utils.sglang_probe_gate import compare_outputs, evaluate_gate, summarize_parity
from ansible.module_utils.sglang_probe_measure import PROMPT_BLOCK_LEN, run_probe, validate_params
from ansible.module_utils.sglang_probe_report import parity_line, summary_line
from probe_fakes import FakeServer

IDS = [11, 12, 13, 14, 15, 16, 17, 18]
LPS = [-0.01, -0.02, -0.03, -0.04, -0.05, -0.06, -0.07, -0.08]


# --- the comparison -----------------------------------------------------------------------------


def test_equal_answers_with_logprobs_are_equal():
    out = compare_outputs(IDS, LPS, list(IDS), list(LPS), 8, 0.5, "host")
    assert out["status"] == "equal"
    assert out["position"] is None
    assert out["logprobs_compared"] is True
    assert out["max_logprob_diff"] == 0.0
    assert out["cold"]["ids"] == IDS
    assert out["warm"]["ids"] == IDS
    assert out["tier"] == "host"


def test_logprobs_within_tolerance_are_equal():
    warm = [lp - 0.3 for lp in LPS]
    out = compare_outputs(IDS, LPS, IDS, warm, 8, 0.5, "device")
    assert out["status"] == "equal"
    assert out["max_logprob_diff"] == pytest.approx(0.3)


def test_logprob_beyond_tolerance_diverges_at_its_position():
    warm = list(LPS)
    warm[5] -= 0.8
    out = compare_outputs(IDS, LPS, IDS, warm, 8, 0.5, "host")
    assert out["status"] == "diverged"
    assert (out["position"], out["cause"]) == (5, "logprob")
    assert out["warm"]["logprobs"][5] == pytest.approx(-0.86)


def test_ids_diverging_at_k_name_k_and_both_runs():
    warm = list(IDS)
    warm[3] = 99
    out = compare_outputs(IDS, LPS, warm, LPS, 8, 0.5, "host")
    assert (out["status"], out["position"], out["cause"]) == ("diverged", 3, "token")
    assert out["cold"]["ids"] == IDS
    assert out["warm"]["ids"] == [11, 12, 13, 99, 15, 16, 17, 18]


def test_only_the_first_n_tokens_count():
    warm = list(IDS)
    warm[6] = 99
    assert compare_outputs(IDS, None, warm, None, 6, 0.5, "device")["status"] == "equal"
    assert compare_outputs(IDS, None, warm, None, 7, 0.5, "device")["position"] == 6


def test_server_without_logprobs_is_compared_by_ids_only_and_says_so():
    out = compare_outputs(IDS, None, IDS, None, 8, 0.5, "device")
    assert out["status"] == "equal"
    assert out["logprobs_compared"] is False
    assert "ids only" in out["note"]
    assert "ids only" in parity_line(summarize_parity({"device": [out]}, 8, 0.5))


def test_server_without_ids_is_not_checkable_never_a_pass():
    out = compare_outputs(None, None, None, None, 8, 0.5, "device")
    assert out["status"] == "not_checkable"
    assert "the cold and warm read returned no output token ids" in out["note"]
    one = compare_outputs(IDS, LPS, None, LPS, 8, 0.5, "host")
    assert one["status"] == "not_checkable"
    assert "the warm read returned no output token ids" in one["note"]


def test_short_answers_are_not_checkable_but_a_difference_in_them_diverges():
    short = compare_outputs(IDS, None, IDS[:3], None, 8, 0.5, "host")
    assert short["status"] == "not_checkable"
    assert "warm read returned 3 of the 8" in short["note"]
    differs = compare_outputs(IDS, None, [11, 99, 13], None, 8, 0.5, "host")
    assert (differs["status"], differs["position"]) == ("diverged", 1)


def test_summary_takes_the_first_diverging_round():
    ok = compare_outputs(IDS, LPS, IDS, LPS, 8, 0.5, "host")
    bad = compare_outputs(IDS, LPS, [11, 12, 99, 14, 15, 16, 17, 18], LPS, 8, 0.5, "host")
    summary = summarize_parity({"host": [ok, bad, ok]}, 8, 0.5)
    assert summary["tiers"]["host"]["round"] == 2
    assert summary["tiers"]["host"]["position"] == 2
    assert summary["tiers"]["host"]["rounds"] == 3


# --- the gate and the report --------------------------------------------------------------------


def _gate(parity):
    p = {"input_len": 100, "max_warm_cold_ratio": None, "min_cached_fraction": None,
         "min_host_cached_fraction": None, "gate": True}
    return evaluate_gate({"warm": {}, "cold": {}, "server": {}, "parity": parity}, p)


def test_gate_fails_with_the_diverging_position_tier_and_both_runs():
    warm = list(IDS)
    warm[3] = 99
    parity = summarize_parity({"host": [compare_outputs(IDS, LPS, warm, LPS, 8, 0.5, "host")]}, 8, 0.5)
    gate = _gate(parity)
    assert gate["passed"] is False
    [reason] = gate["reasons"]
    assert reason.startswith("warm (host) answer differs from the cold one at output token 3 (round 1")
    assert "cold ids [11, 12, 13, 14, 15, 16, 17, 18]" in reason
    assert "warm ids [11, 12, 13, 99, 15, 16, 17, 18]" in reason
    check = next(c for c in gate["checks"] if c["name"] == "host.parity")
    assert check["value"] == "diverged at 3"


def test_gate_fails_on_a_logprob_beyond_tolerance_naming_the_option():
    warm = list(LPS)
    warm[0] = -2.0
    parity = summarize_parity({"device": [compare_outputs(IDS, LPS, IDS, warm, 8, 0.5, "device")]}, 8, 0.5)
    [reason] = _gate(parity)["reasons"]
    assert "warm (device) logprob of output token 0 differs from the cold one by 1.990 > " \
           "parity_logprob_tolerance 0.5" in reason


def test_gate_fails_when_not_checkable_and_names_the_way_out():
    parity = summarize_parity({"device": [compare_outputs(None, None, None, None, 8, 0.5, "device")]}, 8, 0.5)
    [reason] = _gate(parity)["reasons"]
    assert "could not be checked" in reason
    assert "rollout_probe_parity_tokens: 0" in reason


def test_gate_passes_on_equal_answers_and_parity_off_adds_no_check():
    parity = summarize_parity({"device": [compare_outputs(IDS, LPS, IDS, LPS, 8, 0.5, "device")]}, 8, 0.5)
    assert _gate(parity)["passed"] is True
    off = summarize_parity({}, 0, 0.5)
    assert [c for c in _gate(off)["checks"] if c["name"].endswith(".parity")] == []
    assert parity_line(off).startswith("parity: off")


def test_report_line_names_tokens_and_tiers():
    eq = compare_outputs(IDS, LPS, IDS, LPS, 8, 0.5, "device")
    eq_host = dict(eq, tier="host")
    assert parity_line(summarize_parity({"device": [eq], "host": [eq_host]}, 8, 0.5)) == \
        "parity: 8 tokens equal (device tier, host tier)"
    bad = compare_outputs(IDS, None, [11, 12, 13, 14, 15, 16, 99, 18], None, 8, 0.5, "host")
    line = parity_line(summarize_parity({"device": [eq], "host": [bad]}, 8, 0.5))
    assert line == "parity: DIFFERS (host tier at token 6 (token)); 8 tokens equal (device tier)"
    assert parity_line(None) is None
    assert "parity: 8 tokens equal (device tier)" in summary_line(
        {"parity": summarize_parity({"device": [eq]}, 8, 0.5)})


# --- options, prompt, requests, stream ----------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "fault"),
    [
        ({"parity_tokens": -1}, "parity_tokens must be between 0 and 4096 (got -1)"),
        ({"parity_tokens": 5000}, "parity_tokens must be between 0 and 4096 (got 5000)"),
        ({"parity_logprob_tolerance": -0.1}, "parity_logprob_tolerance must be a number >= 0"),
        ({"parity_logprob_tolerance": float("nan")}, "parity_logprob_tolerance must be a number >= 0"),
        ({"temperature": 0.7}, "temperature must be 0 while parity_tokens is 8"),
    ],
)
def test_bad_parity_options_are_refused_by_name(params, over, fault):
    errors = validate_params(params(**over))
    assert any(fault in e for e in errors), errors


def test_sampling_is_allowed_with_parity_off(params):
    assert validate_params(params(temperature=0.7, parity_tokens=0)) == []


def test_prompt_is_a_seeded_block_repeated():
    ids = repeated_block_ids(1000, 32000, 42, 256)
    assert len(ids) == 1000
    assert ids[:256] == ids[256:512] == ids[512:768]
    assert ids[768:] == ids[:232]
    assert len(set(ids[:256])) > 200  # random within the block
    assert repeated_block_ids(1000, 32000, 43, 256)[:256] != ids[:256]
    assert repeated_block_ids(100, 32000, 42, 256) == ids[:100]  # shorter than a block: the block's start


def test_request_asks_logprobs_without_a_prompt_logprob_start():
    body = json.loads(generate_body([1, 2], 8, 0.0, return_logprob=True))
    assert body["return_logprob"] is True
    assert "logprob_start_len" not in body  # -1: no prompt logprobs, the cached prefix is not capped
    assert body["sampling_params"]["temperature"] == 0.0
    assert "return_logprob" not in json.loads(generate_body([1, 2], 8, 0.0))


def _event(ids, total, lps=None):
    meta = {"completion_tokens": total}
    if lps is not None:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, ids, strict=True)]
    return {"output_ids": ids, "meta_info": meta}


def test_stream_whole_and_incremental_give_the_same_answer():
    whole = {"ids": [], "logprobs": []}
    for i in range(1, 4):
        accumulate_output(whole, _event(IDS[:i], i, LPS[:i]))
    delta = {"ids": [], "logprobs": []}
    for i in range(3):
        accumulate_output(delta, _event(IDS[i:i + 1], i + 1, LPS[i:i + 1]))
    accumulate_output(delta, _event([], 3, []))  # a last event carrying no new token
    assert whole == delta == {"ids": IDS[:3], "logprobs": LPS[:3]}


def test_stream_without_ids_logprobs_or_counts_leaves_nothing_to_compare():
    acc = {"ids": [], "logprobs": []}
    accumulate_output(acc, {"meta_info": {"completion_tokens": 1}})
    assert acc == {"ids": None, "logprobs": None}
    acc = {"ids": [], "logprobs": []}
    accumulate_output(acc, {"output_ids": [5], "meta_info": {}})  # no completion_tokens: shape unknown
    assert acc["ids"] is None
    acc = {"ids": [], "logprobs": []}
    accumulate_output(acc, _event([5], 1))
    accumulate_output(acc, _event([6, 7], 2))  # rewrites the first id: neither whole nor a delta
    assert acc["ids"] is None
    acc = {"ids": [], "logprobs": []}
    accumulate_output(acc, _event([5], 1))
    accumulate_output(acc, _event([5, 6, 7], 2))  # the growing list, serialized after a later step
    accumulate_output(acc, _event([5, 6, 7], 3))
    assert acc["ids"] == [5, 6, 7]
    acc = {"ids": [], "logprobs": []}
    accumulate_output(acc, _event([5, True], 2))
    assert acc["ids"] is None


# --- the probe against the fake server ----------------------------------------------------------


def _probe(srv, p):
    client = SGLangClient(p["url"], request_timeout=p["request_timeout"])
    result = run_probe(p, client)
    result["gate"] = evaluate_gate(result, p)
    return result


def test_fake_answering_alike_passes_with_logprobs_both_tiers(params):
    with FakeServer(capacity=1200, logprobs=True) as srv:
        p = params(url=srv.url, input_len=1000, repeats=2, tier="both", max_warm_cold_ratio=0.9)
        result = _probe(srv, p)
        bodies = srv.state.generate_bodies
    assert result["gate"]["passed"], result["gate"]["reasons"]
    assert parity_line(result["parity"]) == "parity: 8 tokens equal (device tier, host tier)"
    assert result["parity"]["tiers"]["host"]["logprobs_compared"] is True
    assert result["parity"]["tiers"]["host"]["rounds"] == 2
    timed = [b for b in bodies if b["sampling_params"]["max_new_tokens"] != 1]
    fillers = [b for b in bodies if b["sampling_params"]["max_new_tokens"] == 1]
    assert len(timed) == 6
    assert fillers
    assert all(b["sampling_params"]["temperature"] == 0 and b["return_logprob"] is True for b in timed)
    assert all(b["logprob_start_len"] is None for b in timed)
    # warm output raised from 2 to parity_tokens 8; fillers ask no logprobs
    assert sorted({b["sampling_params"]["max_new_tokens"] for b in timed}) == [8]
    assert all(not b["return_logprob"] for b in fillers)
    head = timed[0]["head"]
    assert head[:PROMPT_BLOCK_LEN] == head[PROMPT_BLOCK_LEN:2 * PROMPT_BLOCK_LEN]
    assert all(f["head"][:16] != head[:16] for f in fillers)  # no filler shares the prompt's prefix


def test_fake_answering_otherwise_on_the_warm_read_fails_the_gate(params):
    with FakeServer(capacity=1200, warm_diverge_at=3, incremental=True) as srv:
        p = params(url=srv.url, input_len=1000, repeats=1, tier="host", max_warm_cold_ratio=0.9)
        result = _probe(srv, p)
    host = result["parity"]["tiers"]["host"]
    assert (host["status"], host["position"], host["cause"]) == ("diverged", 3, "token")
    assert host["cold"]["ids"][:3] == host["warm"]["ids"][:3]
    assert host["cold"]["ids"][3] != host["warm"]["ids"][3]
    assert result["gate"]["passed"] is False
    [reason] = result["gate"]["reasons"]
    assert reason.startswith("warm (host) answer differs from the cold one at output token 3")
    assert str(host["warm"]["ids"]).replace(" ", "") in reason.replace(" ", "")


def test_fake_with_drifting_logprobs_fails_within_ids(params):
    with FakeServer(capacity=1200, logprobs=True, warm_logprob_shift=0.7) as srv:
        result = _probe(srv, params(url=srv.url, input_len=1000, tier="device", max_warm_cold_ratio=0.9))
    assert result["gate"]["passed"] is False
    assert "warm (device) logprob of output token 0 differs from the cold one by 0.700" in result["gate"]["reasons"][0]
    with FakeServer(capacity=1200, logprobs=True, warm_logprob_shift=0.3) as srv:
        result = _probe(srv, params(url=srv.url, input_len=1000, tier="device", max_warm_cold_ratio=0.9))
    assert result["gate"]["passed"], result["gate"]["reasons"]
    assert result["parity"]["tiers"]["device"]["max_logprob_diff"] == pytest.approx(0.3)


def test_fake_without_output_ids_fails_as_not_checkable_and_parity_off_passes(params):
    with FakeServer(capacity=1200, faults=("no_output_ids",)) as srv:
        checked = _probe(srv, params(url=srv.url, input_len=1000, tier="device", max_warm_cold_ratio=0.9))
        off = _probe(srv, params(url=srv.url, input_len=1000, tier="device", max_warm_cold_ratio=0.9,
                                 parity_tokens=0))
        last = srv.state.generate_bodies[-1]
    assert checked["gate"]["passed"] is False
    assert "could not be checked" in checked["gate"]["reasons"][0]
    assert parity_line(checked["parity"]) == "parity: not checkable (device tier)"
    assert off["gate"]["passed"], off["gate"]["reasons"]
    assert parity_line(off["parity"]).startswith("parity: off")
    assert last["sampling_params"]["max_new_tokens"] == 2
    assert not last["return_logprob"]


def test_ansible_result_and_report_carry_parity(ansible_run, tmp_path):
    report = tmp_path / "probe.json"
    with FakeServer(capacity=1200, warm_diverge_at=1) as srv:
        failed = ansible_run({"url": srv.url, "input_len": 1000, "cold_output_len": 2, "warm_output_len": 2,
                              "repeats": 1, "tier": "device", "max_warm_cold_ratio": 0.9,
                              "report_path": str(report)})
    with FakeServer(capacity=1200) as srv:
        passed = ansible_run({"url": srv.url, "input_len": 1000, "cold_output_len": 2, "warm_output_len": 2,
                              "repeats": 1, "tier": "device", "max_warm_cold_ratio": 0.9})
    assert failed.get("failed") is True
    assert "answer differs from the cold one at output token 1" in failed["msg"]
    assert failed["gate"]["parity"] == "parity: DIFFERS (device tier at token 1 (token))"
    record = json.loads(report.read_text())
    assert record["parity"]["tiers"]["device"]["position"] == 1
    assert record["settings"]["parity_tokens"] == 8
    assert not passed.get("failed"), passed.get("msg")
    assert passed["gate"]["parity"] == "parity: 8 tokens equal (device tier; ids only, the server returned no logprobs)"
    assert "parity: 8 tokens equal (device tier" in passed["msg"]


# --- the probe against the simulator (sim/): greedy ids and logprobs, corrupt_* faults ---------------


@pytest.mark.parametrize("stream_args", [[], ["--incremental-streaming-output"]], ids=["whole", "incremental"])
def test_simulator_answers_alike_with_logprobs_compared(start_sim, params, stream_args):
    from sim_server import SEED_ARGS, probe_once, sim_available

    if not sim_available():
        pytest.skip("the simulator (sim/sglang_sim) is not in this tree")
    sim = start_sim(SEED_ARGS + stream_args)
    # 8,192 ids: a cold read of tens of ms, well above a loaded machine's jitter on a warm one (this test
    # is about parity; with 2,048 ids one CI-like run measured warm 8.1 ms against cold 8.3 ms).
    result = probe_once(params(url=sim.url, input_len=8192, repeats=2, tier="device", max_warm_cold_ratio=0.9,
                               ready_timeout=30, request_timeout=60, flush_timeout=10))
    device = result["parity"]["tiers"]["device"]
    assert result["gate"]["passed"], result["gate"]["reasons"]
    assert device["status"] == "equal"
    assert len(device["cold"]["ids"]) == 8
    assert device["cold"]["ids"] == device["warm"]["ids"]
    # the prompt's block is copied: the answer is the block's start again (2048 = 8 x 256, so it ends
    # at a block boundary), with logprobs near 0 (sim/sglang_sim/output.py)
    assert device["logprobs_compared"] is True
    assert all(-0.5 < lp <= 0 for lp in device["cold"]["logprobs"])
    assert parity_line(result["parity"]) == "parity: 8 tokens equal (device tier)"


@pytest.mark.parametrize(("fault", "bad", "good"), [("corrupt_host_tier", "host", "device"),
                                                    ("corrupt_device_tier", "device", "host")])
def test_simulator_reading_a_tier_back_wrong_fails_at_token_3(start_sim, params, fault, bad, good):
    from sim_server import HICACHE_ARGS, SEED_ARGS, probe_once, sim_available

    if not sim_available():
        pytest.skip("the simulator (sim/sglang_sim) is not in this tree")
    sim = start_sim(SEED_ARGS + HICACHE_ARGS, SGLANG_SIM_FAULT=fault)
    result = probe_once(params(url=sim.url, input_len=16384, repeats=1, tier="both", max_warm_cold_ratio=0.9,
                               ready_timeout=30, request_timeout=60, flush_timeout=10))
    tiers = result["parity"]["tiers"]
    assert (tiers[bad]["status"], tiers[bad]["position"], tiers[bad]["cause"]) == ("diverged", 3, "token")
    assert tiers[bad]["cold"]["ids"][:3] == tiers[bad]["warm"]["ids"][:3]
    assert tiers[good]["status"] == "equal"
    assert result["gate"]["passed"] is False
    assert [r for r in result["gate"]["reasons"] if "answer differs" in r] == [
        r for r in result["gate"]["reasons"] if r.startswith(f"warm ({bad}) answer differs from the cold one at "
                                                             "output token 3 (round 1, temperature 0)")]
    assert any(f"warm ({bad}) answer differs" in r for r in result["gate"]["reasons"])


# --- the rollout role's settings: refused before any host changes (preflight) --------------------


def test_rollout_parity_settings_are_range_checked_before_the_rollout():
    from pathlib import Path

    import yaml
    from plugins import load

    repo = Path(__file__).resolve().parents[2]
    pi = load(repo / "roles/preflight/filter_plugins/preflight_inputs.py", "preflight_inputs_parity")
    found = pi.run_input_findings({"probe": {"rollout_probe_parity_tokens": -1,
                                             "rollout_probe_parity_logprob_tolerance": "lots"}})
    assert any(f.startswith("rollout_probe_parity_tokens = -1 is out of range") for f in found), found
    assert any(f.startswith("rollout_probe_parity_logprob_tolerance = 'lots' is not a number") for f in found), found
    assert pi.run_input_findings({"probe": {"rollout_probe_parity_tokens": 8,
                                            "rollout_probe_parity_logprob_tolerance": 0.5}}) == []
    # the role publishes both to preflight (tasks/settings.yml) and passes both to the module (tasks/probe.yml)
    settings = yaml.safe_load((repo / "roles/rollout/tasks/settings.yml").read_text())[0]
    gate = settings["ansible.builtin.set_fact"]["rollout_settings"]["gate"]
    assert {"rollout_probe_parity_tokens", "rollout_probe_parity_logprob_tolerance"} <= set(gate)
    probe_task = next(t for t in yaml.safe_load((repo / "roles/rollout_gate/tasks/probe.yml").read_text())
                      if "sglang_cache_probe" in t)
    assert probe_task["sglang_cache_probe"]["parity_tokens"] == "{{ rollout_probe_parity_tokens }}"
    assert probe_task["sglang_cache_probe"]["parity_logprob_tolerance"] == \
        "{{ rollout_probe_parity_logprob_tolerance }}"


def test_rollout_md_shows_each_hosts_parity_line_escaped(tmp_path):
    from pathlib import Path

    from plugins import load

    repo = Path(__file__).resolve().parents[2]
    fleet_report = load(repo / "roles/rollout/files/fleet_report.py", "fleet_report_parity")
    rollout = load(repo / "roles/rollout/filter_plugins/rollout.py", "rollout_filters_parity")
    line = "parity: 8 tokens equal (device tier, host tier)"
    # the validation record keeps the probe's gate, and with it gate.parity
    kept = rollout.rollout_gate_summary({"item": {"name": "main"}, "gate": {"passed": True, "parity": line}})
    assert kept["probe"]["gate"]["parity"] == line
    (tmp_path / "hosts").mkdir()
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r1", "inventory": "inventories/demo"}))
    probe = {"cold": {"median_ttft_ms": 1000}, "warm": {}, "gate": kept["probe"]["gate"]}
    records = [{"host": "demo-1", "verdict": "passed", "config_hash": "a" * 64, "probe": probe, "order": 0},
               {"host": "demo-2", "verdict": "passed", "config_hash": "a" * 64, "order": 1,
                "probe": {**probe, "gate": {"passed": True, "parity": "parity: *x* <b>"}}},
               {"host": "demo-3", "verdict": "passed", "config_hash": "a" * 64, "order": 2,
                "probe": {**probe, "gate": {"passed": True}}}]
    for record in records:
        (tmp_path / "hosts" / f"{record['host']}.json").write_text(json.dumps(record))
    assert fleet_report.main(["rollout", str(tmp_path)]) == 0
    section = (tmp_path / "rollout.md").read_text().split("## Answer parity")[1]
    assert f"- **demo-1**: {line}" in section
    assert "- **demo-2**: parity: \\*x\\* \\<b>" in section  # Markdown in a recorded text is escaped
    assert "demo-3" not in section  # a record from before parity: no line
