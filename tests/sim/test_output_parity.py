"""The simulator's output for output-parity checks: deterministic greedy ids, a repeated block
continued, logprobs in SGLang 0.5.23's shape, and the corrupt_host_tier / corrupt_device_tier
faults. Everything goes through the real HTTP server (subprocesses stopped by PID)."""

from __future__ import annotations

import json
import random

import pytest
from simharness import SMALL_ENV, SMALL_HICACHE_ARGS

VOCAB = 248_320
N_OUT = 8  # output tokens read per request (the corrupt_* faults start at index 3)


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _sse(raw: bytes) -> list:
    events = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            data = block[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _greedy(sim, ids, max_new=N_OUT, **extra):
    return sim.post_json("/generate", {"input_ids": ids, **extra, "sampling_params": {
        "max_new_tokens": max_new, "temperature": 0}})


def _host_hit(sim, ids, filler_seed):
    """Re-read ``ids`` after a filler pushed them out of the 4096-token device pool."""
    _greedy(sim, _ids(filler_seed, 3000), 1)
    return _greedy(sim, ids, return_logprob=True)


def test_greedy_output_is_the_same_in_two_processes(sim_factory):
    ids = _ids(11, 600)
    a, b = sim_factory(SMALL_HICACHE_ARGS, SMALL_ENV), sim_factory(SMALL_HICACHE_ARGS, SMALL_ENV)
    first = _greedy(a, ids, return_logprob=True)
    second = _greedy(b, ids, return_logprob=True)
    assert len(first["output_ids"]) == N_OUT
    assert all(0 <= t < VOCAB for t in first["output_ids"])
    assert first["output_ids"] == second["output_ids"]
    assert first["text"] == second["text"]
    assert (first["meta_info"]["output_token_logprobs"]
            == second["meta_info"]["output_token_logprobs"])
    other = _greedy(a, _ids(12, 600))
    assert other["output_ids"] != first["output_ids"]


def test_sampling_varies_unless_seeded(hicache_sim):
    ids = _ids(13, 300)

    def sampled(params):
        return hicache_sim.post_json("/generate", {"input_ids": ids, "sampling_params": {
            "max_new_tokens": N_OUT, **params}})["output_ids"]

    assert sampled({}) != sampled({})  # temperature defaults to 1.0, as in SGLang
    assert sampled({"sampling_seed": 7}) == sampled({"sampling_seed": 7})
    assert sampled({"temperature": 0.7, "top_k": 1}) == _greedy(hicache_sim, ids)["output_ids"]
    status, raw, _ = hicache_sim.request("POST", "/generate", {
        "input_ids": ids, "sampling_params": {"temperature": -1}})
    assert status == 400
    assert "temperature must be a non-negative finite number" in raw.decode()


def test_repeated_block_is_continued_with_high_logprobs(hicache_sim):
    block = _ids(21, 5)
    prompt = _ids(22, 200) + block * 6
    out = _greedy(hicache_sim, prompt, 12, return_logprob=True)
    assert out["output_ids"] == (block * 3)[:12]
    logprobs = [row[0] for row in out["meta_info"]["output_token_logprobs"]]
    assert all(-0.01 <= lp <= -0.001 for lp in logprobs), logprobs
    # The same prompt without the repeat is not copied, and is less certain.
    plain = _greedy(hicache_sim, _ids(22, 200) + block, 12, return_logprob=True)
    assert plain["output_ids"][:5] != block
    assert all(lp < -0.1 for lp, _, _ in plain["meta_info"]["output_token_logprobs"])


def test_logprobs_shape_is_sglang_0_5_23(hicache_sim):
    # Shape read off SGLang 0.5.23: srt/managers/tokenizer_manager.py add_logprob_to_meta_info
    # (input_token_logprobs, output_token_logprobs, output_token_logprobs_length after
    # num_retractions) and detokenize_logprob_tokens ((logprob, token_id, text-or-None) rows);
    # io_struct.py: logprob_start_len defaults to -1 = output tokens only, so
    # input_token_logprobs is [] by default.
    ids = _ids(31, 400)
    out = _greedy(hicache_sim, ids, 6, return_logprob=True)
    meta = out["meta_info"]
    keys = list(meta)
    assert keys[keys.index("num_retractions") + 1:keys.index("reasoning_tokens")] == [
        "input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length"]
    assert meta["input_token_logprobs"] == []
    rows = meta["output_token_logprobs"]
    assert meta["output_token_logprobs_length"] == 6
    assert [r[1] for r in rows] == out["output_ids"]
    assert all(len(r) == 3 and isinstance(r[0], float) and r[0] < 0 and r[2] is None
               for r in rows)
    # Without return_logprob nothing new appears.
    plain = _greedy(hicache_sim, ids, 6)["meta_info"]
    assert not [k for k in plain if "logprob" in k]
    # return_text_in_logprobs: the text of each token is the third item.
    texted = _greedy(hicache_sim, ids, 6, return_logprob=True, return_text_in_logprobs=True)
    texts = [r[2] for r in texted["meta_info"]["output_token_logprobs"]]
    assert "".join(texts) == texted["text"]
    # top_logprobs_num: one list of k rows per output position, the greedy pick first.
    top = _greedy(hicache_sim, ids, 6, return_logprob=True, top_logprobs_num=3)["meta_info"]
    assert top["input_top_logprobs"] == []
    assert len(top["output_top_logprobs"]) == 6
    for row, pick in zip(top["output_top_logprobs"], top["output_token_logprobs"], strict=True):
        assert len(row) == 3
        assert row[0] == pick
        assert row[1][0] < row[0][0]


def test_logprob_start_len_gives_prompt_logprobs_and_caps_the_cache(hicache_sim):
    # logprob_result_processor.py: input logprobs start with None; the ids are the prompt's from
    # logprob_start_len on. schedule_batch.py _compute_max_prefix_len: the prefix match stops there.
    ids = _ids(41, 300)
    _greedy(hicache_sim, ids, 1)
    meta = _greedy(hicache_sim, ids, 2, return_logprob=True, logprob_start_len=100)["meta_info"]
    rows = meta["input_token_logprobs"]
    assert len(rows) == 200
    assert rows[0] == [None, ids[100], None]
    assert [r[1] for r in rows] == ids[100:]
    assert all(isinstance(r[0], float) for r in rows[1:])
    assert meta["cached_tokens"] == 100
    top = _greedy(hicache_sim, ids, 1, return_logprob=True, logprob_start_len=298,
                  top_logprobs_num=2, return_text_in_logprobs=True)["meta_info"]
    assert top["input_top_logprobs"][0] is None
    (row,) = top["input_top_logprobs"][1:]
    assert len(row) == 2
    assert row[0][1] == ids[299]
    assert all(isinstance(r[2], str) for r in row)
    assert top["input_token_logprobs"][1][0] == row[0][0]
    status, raw, _ = hicache_sim.request("POST", "/generate", {
        "input_ids": ids, "return_logprob": True, "logprob_start_len": 301})
    assert status == 400
    assert "Please use a smaller logprob_start_len" in raw.decode()


@pytest.mark.parametrize("incremental", [False, True])
def test_streamed_logprobs_cumulative_or_incremental(sim_factory, incremental):
    # tokenizer_manager.py: output_* logprob lists are cumulative per chunk, or sliced to the new
    # rows with --incremental-streaming-output (_slice_streaming_output_meta_info);
    # output_token_logprobs_length counts all rows so far.
    extra = ["--incremental-streaming-output"] if incremental else []
    sim = sim_factory([*SMALL_HICACHE_ARGS, *extra], SMALL_ENV)
    ids = _ids(51, 300)
    status, raw, _ = sim.request("POST", "/generate", {
        "input_ids": ids, "stream": True, "return_logprob": True,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert status == 200
    chunks = _sse(raw)[:-1]
    whole = _greedy(sim, ids, 4, return_logprob=True)["meta_info"]["output_token_logprobs"]
    assert [c["meta_info"]["output_token_logprobs_length"] for c in chunks] == [1, 2, 3, 4]
    if incremental:
        assert [c["meta_info"]["output_token_logprobs"] for c in chunks] == [[r] for r in whole]
    else:
        assert [c["meta_info"]["output_token_logprobs"] for c in chunks] == [
            whole[:i] for i in range(1, 5)]
    assert all(c["meta_info"]["input_token_logprobs"] == [] for c in chunks)


def test_without_faults_every_warm_read_equals_the_cold(hicache_sim):
    assert hicache_sim.request("POST", "/flush_cache")[0] == 200
    ids = _ids(61, 3000)
    cold = _greedy(hicache_sim, ids, return_logprob=True)
    device = _greedy(hicache_sim, ids, return_logprob=True)
    host = _host_hit(hicache_sim, ids, 62)
    assert device["meta_info"]["cached_tokens_details"] == {"device": 2999, "host": 0}
    assert host["meta_info"]["cached_tokens_details"]["host"] > 0
    assert cold["output_ids"] == device["output_ids"] == host["output_ids"]
    assert cold["text"] == device["text"] == host["text"]


@pytest.mark.parametrize("fault", ["corrupt_host_tier", "corrupt_device_tier"])
def test_corrupt_tier_faults(sim_factory, fault):
    sim = sim_factory(SMALL_HICACHE_ARGS, {**SMALL_ENV, "SGLANG_SIM_FAULT": fault})
    ids = _ids(71, 3000)
    cold = _greedy(sim, ids, return_logprob=True)
    device = _greedy(sim, ids, return_logprob=True)
    host = _host_hit(sim, ids, 72)
    assert cold["meta_info"]["cached_tokens"] == 0
    assert device["meta_info"]["cached_tokens_details"] == {"device": 2999, "host": 0}
    assert host["meta_info"]["cached_tokens_details"]["host"] > 0
    bad, good = (host, device) if fault == "corrupt_host_tier" else (device, host)
    assert good["output_ids"] == cold["output_ids"]
    # The first 3 tokens agree, every later one differs (sim/README.md, fault table).
    assert bad["output_ids"][:3] == cold["output_ids"][:3]
    assert all(b != c for b, c in zip(bad["output_ids"][3:], cold["output_ids"][3:], strict=True))
    assert bad["text"] != cold["text"]
    lps = [r[0] for r in bad["meta_info"]["output_token_logprobs"]]
    assert all(-3.0 <= lp < 0 for lp in lps)
    assert bad["meta_info"]["sglang_sim"]["corrupted_from"] == 3
    assert good["meta_info"]["sglang_sim"]["corrupted_from"] is None


def test_openai_completions_greedy_text_is_deterministic(hicache_sim):
    ids = _ids(81, 200)

    def text(temperature):
        body = {"prompt": ids, "max_tokens": 6, "temperature": temperature}
        return hicache_sim.post_json("/v1/completions", body)["choices"][0]["text"]

    assert text(0) == text(0) == _greedy(hicache_sim, ids, 6)["text"]
    assert text(1.0) != text(1.0)
