"""The probe's HTTP client against hostile or broken servers (issue 24): each fake does one thing wrong,
and the client fails in bounded time and memory with a message that is safe to show.

"Bounded time" is checked against a generous bound (HANG_BOUND_S), never as a speed target."""

from __future__ import annotations

import json
import time

import pytest
from ansible.module_utils.sglang_probe_client import (
    MAX_BODY_BYTES,
    MAX_EVENT_BYTES,
    ProbeError,
    RedirectError,
    SGLangClient,
    generate_body,
    safe_text,
)
from ansible.module_utils.sglang_probe_gate import evaluate_gate
from ansible.module_utils.sglang_probe_measure import run_probe
from hostile_fakes import EVIL_TEXT, HostileServer, Recorder

HANG_BOUND_S = 45.0
KEY = "k3y-value-never-shown"


def probe_once(p):
    client = SGLangClient(p["url"], p.get("api_key"), p["request_timeout"], p.get("admin_api_key"))
    result = run_probe(p, client)
    result["gate"] = evaluate_gate(result, p)
    return result


def assert_safe(msg: str) -> None:
    """No control character of the server's text survives into the message."""
    assert not any(ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in msg), repr(msg)
    assert "\u202e" not in msg


def test_a_redirect_is_a_failure_and_the_key_never_reaches_its_target(params):
    with Recorder() as target, HostileServer("redirect", redirect_to=target.url) as srv:
        with pytest.raises(RedirectError) as err:
            probe_once(params(url=srv.url, api_key=KEY, ready_timeout=30.0))
        assert target.seen == []
        assert srv.seen
        assert srv.seen[0][2] == f"Bearer {KEY}"
        assert len(srv.seen) == 1, "the health wait went on polling a redirect"
    msg = str(err.value)
    assert "HTTP 307" in msg
    assert "follows no redirects" in msg
    assert KEY not in msg


@pytest.mark.parametrize("path", ["/generate", "/get_server_info"])
def test_a_redirect_of_any_request_is_not_followed(path):
    with Recorder() as target, HostileServer("redirect", redirect_to=target.url) as srv:
        client = SGLangClient(srv.url, KEY, 10.0)
        call = ((lambda: client.stream_generate(generate_body([1, 2, 3], 1, 0.0))) if path == "/generate"
                else (lambda: client.get_json((path,))))
        with pytest.raises(RedirectError, match=r"answered HTTP 307 \(a redirect to http://127\.0\.0\.1"):
            call()
        assert target.seen == []


def test_a_huge_control_response_fails_at_the_cap():
    with HostileServer("huge") as srv:
        client = SGLangClient(srv.url, None, 10.0)
        with pytest.raises(ProbeError, match=f"answered more than {MAX_BODY_BYTES} bytes"):
            client.get_json(("/get_server_info",))


def test_a_huge_stream_event_fails_at_the_cap():
    with HostileServer("huge_event") as srv:
        client = SGLangClient(srv.url, None, 30.0)
        with pytest.raises(ProbeError, match=f"streamed an event of more than {MAX_EVENT_BYTES} bytes"):
            client.stream_generate(generate_body([1, 2, 3], 1, 0.0))


def test_a_dripping_control_response_fails_by_the_overall_deadline():
    with HostileServer("drip") as srv:
        client = SGLangClient(srv.url, None, 1.0)
        start = time.monotonic()
        with pytest.raises(ProbeError, match=r"no complete answer within 1 s \(the deadline of the whole request"):
            client.get_json(("/get_server_info",))
        assert time.monotonic() - start < HANG_BOUND_S


def test_a_dripping_stream_fails_by_the_overall_deadline():
    with HostileServer("drip_stream") as srv:
        client = SGLangClient(srv.url, None, 1.0)
        start = time.monotonic()
        with pytest.raises(ProbeError, match=r"POST http://127\.0\.0\.1:\d+/generate: no complete answer within 1 s"):
            client.stream_generate(generate_body([1, 2, 3], 1, 0.0))
        assert time.monotonic() - start < HANG_BOUND_S


def test_an_error_body_with_control_characters_is_shown_safe(params):
    with HostileServer("evil_error") as srv:
        with pytest.raises(ProbeError) as err:
            probe_once(params(url=srv.url, tier="device"))
    msg = str(err.value)
    assert "answered HTTP 500" in msg
    assert "boom" in msg  # the text is kept, its controls are not
    assert "pwned" in msg
    assert_safe(msg)


@pytest.mark.parametrize("option", ["api_key", "admin_api_key"])
@pytest.mark.parametrize("bad", [KEY + "\n", KEY + " ", "k3y\tvalue", KEY + "\u00e9"])
def test_a_key_with_whitespace_is_refused_naming_the_variable_never_the_value(option, bad):
    with pytest.raises(ProbeError) as err:
        SGLangClient("http://127.0.0.1:1", **{option: bad})
    msg = str(err.value)
    assert f"sglang_service_{option}" in msg
    assert "value is not shown" in msg
    assert "k3y" not in msg


def test_safe_text_strips_controls_and_keeps_the_words():
    text = safe_text(EVIL_TEXT.encode())
    assert_safe(text)
    assert "boom" in text
    assert "**bold**" in text


def test_ansible_key_with_a_newline_never_reaches_the_result_or_the_progress_file(ansible_run, tmp_path):
    progress = tmp_path / "probe.progress"
    with HostileServer() as srv:
        result = ansible_run({"url": srv.url, "api_key": KEY + "\n", "progress_path": str(progress)})
        assert srv.seen == []
    assert result.get("failed") is True
    assert "sglang_service_api_key" in result["msg"]
    assert "k3y-value" not in json.dumps(result)
    assert "k3y-value" not in result["_stdout"]
    assert not progress.exists() or "k3y-value" not in progress.read_text()


# ---- absurd sizes: the gate never passes on them ------------------------------------------------


@pytest.mark.parametrize(("meta", "field"), [
    ({"cached_tokens": 5000}, "meta_info.cached_tokens 5000, more than the prompt's 512"),
    ({"prompt_tokens": 10_000_000}, "meta_info.prompt_tokens 10000000 for a prompt of 512"),
    ({"cached_tokens": 100, "cached_tokens_details": {"device": 0, "host": 400}},
     "meta_info.cached_tokens_details.host 400, more than meta_info.cached_tokens 100"),
    ({"cached_tokens": -3}, "meta_info.cached_tokens = -3"),
    ({"cached_tokens": 10, "cached_tokens_details": {"device": -1, "host": 0}},
     "meta_info.cached_tokens_details.device = -1"),
    ({"completion_tokens": "1\x1b[2J"}, r'meta_info.completion_tokens = "1\u001b[2J"'),
])
def test_absurd_token_counts_fail_the_probe_naming_the_field(params, meta, field):
    with HostileServer("sizes", meta=meta) as srv:
        with pytest.raises(ProbeError) as err:
            probe_once(params(url=srv.url, input_len=512, tier="device"))
    assert field in str(err.value)
    assert_safe(str(err.value))


@pytest.mark.parametrize(("info", "field"), [
    ({"page_size": 4096}, "page_size 4096, larger than the prompt's input_len 512"),
    ({"page_size": -16}, "page_size = -16"),
    ({"page_size": 0}, "page_size = 0"),
    ({"max_total_num_tokens": -1}, "max_total_num_tokens = -1"),
])
def test_absurd_server_sizes_fail_before_any_generate(params, info, field):
    with HostileServer("sizes", info=info) as srv:
        with pytest.raises(ProbeError, match=field.replace("(", r"\(")) as err:
            probe_once(params(url=srv.url, input_len=512, tier="device"))
        assert not any(path == "/generate" for _, path, _ in srv.seen)
    assert_safe(str(err.value))


def test_server_names_with_controls_reach_the_result_safe(params):
    with HostileServer("evil_names") as srv:
        result = probe_once(params(url=srv.url, input_len=512, tier="device"))
    for field in ("model_path", "served_model_name"):
        assert "boom" in result["server"][field]
        assert_safe(result["server"][field])
