"""The module's contract beyond the figures: what `changed` means, bad URLs as messages, progress
written while it runs, probes of one host measured one after another (lock_path)."""

from __future__ import annotations

import json
import stat
import threading
import time

import pytest
from ansible.module_utils.sglang_probe_client import ProbeError, SGLangClient, parse_url
from ansible.module_utils.sglang_probe_measure import HostLock, run_probe
from ansible.module_utils.sglang_probe_report import ProgressLog, round_line
from probe_fakes import FakeServer


@pytest.mark.parametrize(
    ("url", "fault"),
    [
        ("http://[::1", "not a valid URL"),
        ("http://127.0.0.1:99999", "not a valid URL"),
        ("http://127.0.0.1:port", "not a valid URL"),
        ("http://127.0.0.1:0", "port 0"),
        ("127.0.0.1:30000", "must start with http:// or https://"),
        ("ftp://127.0.0.1/", "must start with http:// or https://"),
        ("http://", "names no host"),
        ("http://127.0.0.1:30000/v1?x=1", "query or fragment"),
        ("http://user:pw@127.0.0.1:30000", "carries credentials"),
        ("http://127.0.0.1:30000/a b", "whitespace or control characters"),
        ("", "must be the server's base URL"),
    ],
)
def test_malformed_url_is_a_sentence(url, fault):
    with pytest.raises(ProbeError, match=fault):
        parse_url(url)


def test_url_forms_that_work():
    assert parse_url("http://127.0.0.1:30000") == ("http", "127.0.0.1", 30000, "")
    assert parse_url(" https://gw.example/sglang/ ") == ("https", "gw.example", 443, "/sglang")
    assert parse_url("http://[::1]:8080") == ("http", "::1", 8080, "")
    assert SGLangClient("http://127.0.0.1:30000/").url == "http://127.0.0.1:30000"


def test_round_line_has_each_tier_and_the_ratio():
    runs = {"cold": {"ttft_s": 1.92, "cached_tokens": 0},
            "device": {"ttft_s": 0.0123, "cached_tokens": 63999, "host_cached_tokens": 0},
            "host": {"ttft_s": 0.0265, "cached_tokens": 63999, "host_cached_tokens": 63999}}
    line = round_line(2, 3, runs)
    assert line == ("round 2/3: cold TTFT 1.92 s (cached 0); warm device TTFT 12.3 ms, 0.0064 of cold "
                    "(cached 63999); warm host TTFT 26.5 ms, 0.0138 of cold (cached 63999, from host 63999)")


def test_progress_log_is_written_round_by_round(params, tmp_path):
    path = tmp_path / "state" / "probe.progress"
    seen: list[list[str]] = []
    log = ProgressLog(str(path))

    def on_round(number, total, runs):
        log.on_round(number, total, runs)
        seen.append(path.read_text().splitlines())  # on disk before the next round starts

    with FakeServer(capacity=1200) as srv:
        p = params(url=srv.url, input_len=1000, repeats=3, max_warm_cold_ratio=0.9)
        run_probe(p, SGLangClient(srv.url, None, 10), on_round=on_round)
    assert [len(lines) for lines in seen] == [1, 2, 3]
    assert seen[-1][0].startswith("round 1/3: cold TTFT ")
    assert "warm host TTFT" in seen[-1][2]
    assert ProgressLog(None).write("nothing") is None  # no path, no file


def test_progress_file_is_root_only_even_when_an_older_one_was_not(tmp_path):
    """Issue 24: the progress file (it names the server and its errors) is 0600, also when an older
    run left one with 0644; umask does not widen it."""
    fresh = tmp_path / "fresh.progress"
    ProgressLog(str(fresh)).write("start: x")
    old = tmp_path / "old.progress"
    old.write_text("from an older run\n")
    old.chmod(0o644)
    ProgressLog(str(old)).write("start: y")
    assert old.read_text() == "start: y\n"
    for path in (fresh, old):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_progress_path_not_writable_is_a_sentence(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ProbeError, match="cannot write progress_path"):
        ProgressLog(str(blocker / "sub" / "probe.progress"))


def test_host_lock_serializes_and_gives_up(tmp_path):
    lock = str(tmp_path / "probe.lock")
    order: list[str] = []
    with HostLock(lock, timeout=5):
        waiter = threading.Thread(target=lambda: (HostLock(lock, timeout=5).__enter__(), order.append("second")))
        waiter.start()
        time.sleep(0.3)
        order.append("first done")
        with pytest.raises(ProbeError, match=r"lock_timeout 0\.2 s"):
            HostLock(lock, timeout=0.2).__enter__()
    waiter.join(timeout=10)
    assert order == ["first done", "second"]
    with HostLock(None, timeout=1) as none:
        assert none.waited_s == 0.0


def test_ansible_changed_only_when_the_report_is_written(ansible_run, tmp_path):
    progress = tmp_path / "probe.progress"
    with FakeServer(capacity=1200) as srv:
        args = {"url": srv.url, "input_len": 1000, "cold_output_len": 2, "warm_output_len": 2, "repeats": 2,
                "max_warm_cold_ratio": 0.9, "ready_timeout": 5, "progress_path": str(progress),
                "lock_path": str(tmp_path / "probe.lock")}
        measured = ansible_run(args)
        lines = progress.read_text().splitlines()
        reported = ansible_run(args | {"report_path": str(tmp_path / "probe.json")})
        checked = ansible_run(args | {"report_path": str(tmp_path / "other.json")}, check=True)
    # The cache was flushed and refilled: nothing for the operator to act on.
    assert not measured.get("failed"), measured.get("msg")
    assert measured["changed"] is False
    assert measured["lock_waited_s"] >= 0
    assert lines[0].startswith(f"start: {srv.url}, 1000 tokens, 2 rounds")
    assert [line.split(":")[0] for line in lines[1:3]] == ["round 1/2", "round 2/2"]
    assert lines[-1].startswith("end: cold TTFT ")
    assert "gate passed" in lines[-1]
    # A JSON record written on the host is a change; check mode predicts it and writes nothing.
    assert reported["changed"] is True
    assert json.loads((tmp_path / "probe.json").read_text())["gate"]["passed"] is True
    assert checked["changed"] is True
    assert checked["requests_sent"] == 0
    assert not (tmp_path / "other.json").exists()


def test_ansible_malformed_url_fails_with_its_message(ansible_run, tmp_path):
    for url, fault in (("http://[::1", "is not a valid URL"), ("http://127.0.0.1:99999", "is not a valid URL"),
                       ("localhost:30000", "must start with http://")):
        result = ansible_run({"url": url, "progress_path": str(tmp_path / "p")})
        assert result.get("failed") is True
        assert fault in result["msg"], result["msg"]
        # the module's own failure (ansible-core 2.19 adds "(traceback unavailable)" to every failure),
        # not a crash: no Python traceback, no MODULE FAILURE
        assert "Traceback" not in json.dumps(result)
        assert "module_stderr" not in result
        assert "MODULE FAILURE" not in result["msg"]
