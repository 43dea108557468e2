"""The simulator's HTTP API against SGLang 0.5.23's shapes: fields, streaming, cache, auth, flush."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
from sglang_sim.args import table
from sglang_sim.tokenizer import tokenize
from simharness import SMALL_ENV, SMALL_HICACHE_ARGS


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(248_320) for _ in range(n)]


def _sse(raw: bytes) -> list:
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_server_info_fields(hicache_sim):
    info = hicache_sim.get_json("/get_server_info")
    assert set(info) == set(hicache_sim.get_json("/server_info"))
    assert info["max_total_num_tokens"] == 4096
    assert info["internal_states"][0]["memory_usage"]["token_capacity"] == 4096
    assert info["internal_states"][0]["enable_hierarchical_cache"] is True
    assert info["version"] == "0.5.23"
    assert info["page_size"] == 1
    assert info["enable_hierarchical_cache"] is True
    assert info["hicache_ratio"] == 2.0
    assert info["hicache_size"] == 0
    assert info["hicache_write_policy"] == "write_through"
    assert info["hicache_io_backend"] == "kernel"  # a real field the sim does not model
    assert info["tp_size"] == 2
    assert info["served_model_name"] == "sim-model"
    assert "--enable-hierarchical-cache" in info["launch_command"]
    assert info["max_req_input_len"] == 4096 - 1 - 5
    assert set(table()["fields"]) <= set(info)  # every real ServerArgs field is there
    sim = info["sglang_sim"]
    assert sim["simulator"] is True
    assert sim["host_pool_tokens"] == 2 * 4096 + 1


def test_model_info_and_models(hicache_sim):
    for path in ("/get_model_info", "/model_info"):
        info = hicache_sim.get_json(path)
        assert info["served_model_name"] == "sim-model"
        assert info["is_generation"] is True
        assert info["architectures"] == ["Qwen3_5ForCausalLM"]
    models = hicache_sim.get_json("/v1/models")
    assert models["object"] == "list"
    card = models["data"][0]
    assert (card["id"], card["root"], card["max_model_len"]) == ("sim-model", "sim-model", 262144)
    assert hicache_sim.get_json("/v1/models/sim-model")["id"] == "sim-model"
    assert hicache_sim.request("GET", "/v1/models/other")[0] == 404
    assert hicache_sim.request("GET", "/no-such-route")[0] == 404


def test_health_and_ready(hicache_sim):
    for path in ("/health", "/health_generate", "/ready"):
        assert hicache_sim.request("GET", path)[0] == 200


def test_generate_meta_info_and_device_hit(hicache_sim):
    ids = _ids(1, 1000)
    greedy = {"max_new_tokens": 5, "temperature": 0}
    first = hicache_sim.post_json("/generate", {"input_ids": ids, "sampling_params": greedy})
    meta = first["meta_info"]
    assert meta["prompt_tokens"] == 1000
    assert meta["completion_tokens"] == 5
    assert meta["cached_tokens"] == 0
    assert "cached_tokens_details" not in meta
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert meta["e2e_latency"] > 0
    assert len(first["output_ids"]) == 5
    assert isinstance(first["text"], str)
    assert first["text"]
    again = hicache_sim.post_json("/generate", {"input_ids": ids, "sampling_params": greedy})
    assert again["meta_info"]["cached_tokens"] == 999
    assert again["meta_info"]["cached_tokens_details"] == {"device": 999, "host": 0}
    assert again["text"] == first["text"]  # deterministic greedy output


def test_host_hit_after_device_eviction(hicache_sim):
    assert hicache_sim.request("POST", "/flush_cache")[0] == 200
    ids = _ids(2, 3000)
    hicache_sim.post_json("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
    # A filler larger than what is left of the 4096-token device pool pushes most of it out;
    # both fit in the 8193-token host pool.
    hicache_sim.post_json("/generate", {"input_ids": _ids(3, 3000),
                                        "sampling_params": {"max_new_tokens": 1}})
    back = hicache_sim.post_json("/generate", {"input_ids": ids,
                                               "sampling_params": {"max_new_tokens": 1}})
    details = back["meta_info"]["cached_tokens_details"]
    assert details["host"] > 0
    assert details["device"] + details["host"] == 2999


def test_text_and_its_token_ids_hit_the_same_cache(hicache_sim):
    text = "Shared RAG document about HiCache and the 7900 XTX. " * 40
    first = hicache_sim.post_json("/generate", {"text": text,
                                                "sampling_params": {"max_new_tokens": 1}})
    tokens = hicache_sim.post_json("/tokenize", {"prompt": text})
    assert tokens["tokens"] == list(tokenize(text, 248_320))
    assert tokens["count"] == first["meta_info"]["prompt_tokens"]
    by_ids = hicache_sim.post_json("/generate", {"input_ids": tokens["tokens"],
                                                 "sampling_params": {"max_new_tokens": 1}})
    assert by_ids["meta_info"]["cached_tokens"] == tokens["count"] - 1


def test_generate_stream_is_sse_with_cumulative_text(hicache_sim):
    status, raw, headers = hicache_sim.request(
        "POST", "/generate",
        {"text": "stream me " * 30, "sampling_params": {"max_new_tokens": 4}, "stream": True})
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    events = _sse(raw)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == 4
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3, 4]
    assert chunks[-1]["text"].startswith(chunks[0]["text"])
    assert chunks[0]["meta_info"]["finish_reason"] is None
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert "e2e_latency" in chunks[-1]["meta_info"]


def test_completions_usage_cache_report_and_sglext(hicache_sim):
    prompt = "completion prompt " * 50
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 3,
            "return_cached_tokens_details": True}
    hicache_sim.post_json("/v1/completions", body)
    resp = hicache_sim.post_json("/v1/completions", body)
    assert resp["object"] == "text_completion"
    assert resp["choices"][0]["finish_reason"] == "length"
    usage = resp["usage"]
    assert usage["completion_tokens"] == 3
    assert usage["total_tokens"] == usage["prompt_tokens"] + 3
    assert usage["prompt_tokens_details"] == {"cached_tokens": usage["prompt_tokens"] - 1}
    assert resp["sglext"]["cached_tokens_details"]["device"] == usage["prompt_tokens"] - 1
    token_prompt = hicache_sim.post_json("/v1/completions", {"prompt": _ids(9, 50),
                                                             "max_tokens": 1})
    assert token_prompt["usage"]["prompt_tokens"] == 50


def test_completions_stream_include_usage(hicache_sim):
    status, raw, _ = hicache_sim.request("POST", "/v1/completions", {
        "prompt": "usage please " * 20, "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200
    events = _sse(raw)
    assert events[-1] == "[DONE]"
    final = events[-2]
    assert final["choices"] == []
    assert final["usage"]["completion_tokens"] == 3
    assert "prompt_tokens_details" in final["usage"]
    assert all(e["usage"] is None for e in events[:-2])
    status, raw, _ = hicache_sim.request("POST", "/v1/completions", {
        "prompt": "no usage " * 20, "max_tokens": 2, "stream": True})
    assert all(e == "[DONE]" or e["choices"] for e in _sse(raw))


def test_chat_completions(hicache_sim):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Summarise the code base. " * 20}]
    resp = hicache_sim.post_json("/v1/chat/completions", {"model": "sim-model",
                                                          "messages": messages, "max_tokens": 4})
    assert resp["object"] == "chat.completion"
    assert resp["choices"][0]["message"]["role"] == "assistant"
    assert resp["choices"][0]["message"]["content"]
    _status, raw, _ = hicache_sim.request("POST", "/v1/chat/completions", {
        "messages": messages, "max_tokens": 2, "stream": True,
        "stream_options": {"include_usage": True}})
    events = _sse(raw)
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # same messages


def test_metrics(hicache_sim):
    hicache_sim.post_json("/generate", {"input_ids": _ids(20, 500),
                                        "sampling_params": {"max_new_tokens": 1}})
    status, raw, _ = hicache_sim.request("GET", "/metrics")
    assert status == 200
    text = raw.decode()
    for name in ("sglang:cache_hit_rate", "sglang:prompt_tokens_total",
                 'sglang:cached_tokens_total{model_name="sim-model",engine_type="unified",'
                 'cache_source="device"}',
                 "sglang:time_to_first_token_seconds_bucket",
                 "sglang:hicache_host_used_tokens", "sglang:hicache_host_total_tokens"):
        assert name in text
    total = [ln for ln in text.splitlines() if ln.startswith("sglang:hicache_host_total_tokens")]
    assert total[0].endswith(f" {float(2 * 4096 + 1)}")


def test_context_length_error_is_400(hicache_sim):
    status, raw, _ = hicache_sim.request("POST", "/generate", {
        "input_ids": _ids(5, 5000), "sampling_params": {"max_new_tokens": 1}})
    assert status == 400
    assert "exceeds the maximum allowed length" in json.loads(raw)["error"]["message"]


@pytest.mark.parametrize(("path", "field"), [("/generate", "input_ids"), ("/v1/completions", "prompt")])
@pytest.mark.parametrize("bad", [248_320, 10**9, -1])
def test_token_id_outside_the_vocabulary_is_400(hicache_sim, path, field, bad):
    ids = _ids(6, 300)
    ids[117] = bad
    body = {field: ids, "sampling_params": {"max_new_tokens": 1}, "max_tokens": 1}
    status, raw, _ = hicache_sim.request("POST", path, body)
    assert status == 400, raw
    # Worded as SGLang 0.5.23's tokenizer manager words its vocabulary check.
    assert json.loads(raw)["error"]["message"] == (
        f"input_ids contains out-of-vocabulary token id {bad}; valid range is [0, 248320).")
    # The largest valid id is served.
    ids[117] = 248_319
    status, raw, _ = hicache_sim.request("POST", path, body)
    assert status == 200, raw


def test_flush_clears_device_and_host(hicache_sim):
    ids = _ids(30, 2000)
    hicache_sim.post_json("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
    before = hicache_sim.get_json("/get_server_info")["sglang_sim"]
    assert before["device_used_tokens"] > 0
    assert before["host_used_tokens"] > 0
    status, raw, _ = hicache_sim.request("POST", "/flush_cache")
    assert status == 200
    assert raw.startswith(b"Cache flushed.")
    after = hicache_sim.get_json("/get_server_info")["sglang_sim"]
    assert (after["device_used_tokens"], after["host_used_tokens"]) == (0, 0)
    again = hicache_sim.post_json("/generate", {"input_ids": ids,
                                                "sampling_params": {"max_new_tokens": 1}})
    assert again["meta_info"]["cached_tokens"] == 0


def test_busy_flush_fails_then_waits(sim_factory):
    # Decode at 5 tokens/s x time scale 1.0: a 6-token request keeps the server busy ~1 s.
    sim = sim_factory(SMALL_HICACHE_ARGS, {**SMALL_ENV, "SGLANG_SIM_TIME_SCALE": "1.0",
                                           "SGLANG_SIM_PREFILL_RATE": "1e9",
                                           "SGLANG_SIM_DECODE_RATE": "5"})
    worker = threading.Thread(target=sim.post_json, args=("/generate", {
        "input_ids": _ids(40, 100), "sampling_params": {"max_new_tokens": 6}}), daemon=True)
    worker.start()
    deadline = time.monotonic() + 5
    while sim.get_json("/get_server_info")["sglang_sim"]["running"] == 0:
        assert time.monotonic() < deadline, "request never started"
        time.sleep(0.01)
    status, raw, _ = sim.request("POST", "/flush_cache?timeout=0")
    assert (status, raw) == (400, b"Flush cache failed.\n")
    status, raw, _ = sim.request("GET", "/flush_cache?timeout=20")
    assert status == 200
    assert sim.get_json("/get_server_info")["sglang_sim"]["running"] == 0
    worker.join(timeout=10)
    assert not worker.is_alive()


def test_api_key(sim_factory):
    sim = sim_factory(["--tp-size", "2", "--api-key", "s3cret"])
    sim.api_key = None
    assert sim.request("GET", "/get_server_info")[0] == 401
    assert sim.request("POST", "/generate", {"text": "x"})[0] == 401
    assert sim.request("GET", "/v1/models", headers={"Authorization": "Bearer nope"})[0] == 401
    assert sim.request("GET", "/health")[0] == 200
    assert sim.request("GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})[0] == 200
    assert sim.request("POST", "/flush_cache",
                       headers={"Authorization": "Bearer s3cret"})[0] == 200


@pytest.fixture(scope="module")
def plain_sim(sim_factory):
    """No HiCache, no cache report, no metrics."""
    return sim_factory(["--tp-size", "2"], {"SGLANG_SIM_DEVICE_TOKENS": "4096"})


def test_without_hicache_evicted_prefix_is_recomputed(plain_sim):
    ids = _ids(50, 3000)
    plain_sim.post_json("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
    for seed in (51, 52):
        plain_sim.post_json("/generate", {"input_ids": _ids(seed, 3000),
                                          "sampling_params": {"max_new_tokens": 1}})
    back = plain_sim.post_json("/generate", {"input_ids": ids,
                                             "sampling_params": {"max_new_tokens": 1}})
    assert back["meta_info"].get("cached_tokens_details", {}).get("host", 0) == 0
    assert back["meta_info"]["cached_tokens"] < 2999
    info = plain_sim.get_json("/get_server_info")
    assert info["enable_hierarchical_cache"] is False
    assert info["sglang_sim"]["host_pool_tokens"] == 0


def test_without_cache_report_usage_details_are_null(plain_sim):
    resp = plain_sim.post_json("/v1/completions", {"prompt": "abc " * 10, "max_tokens": 1})
    assert resp["usage"]["prompt_tokens_details"] is None
    assert plain_sim.request("GET", "/metrics")[0] == 404
