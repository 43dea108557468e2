"""Issue 27 item 3's module: sglang_warm_set sends an operator's warm set once, against the real
SGLang simulator (sim/) and through Ansible; request errors are reported, never failed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils.sglang_probe_client import ProbeError
from ansible.module_utils.sglang_warm_set import load_prompt, send_warm_set, validate_params, warm_body
from plugins import ROOT as REPO
from plugins import ansible_bin, ansible_env
from procs import free_port
from sim_server import HICACHE_ARGS, SEED_ARGS, sim_available

PLAYBOOK = """\
- name: Warm once
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Warm
      sglang_warm_set: {args}
      register: warm_result
      ignore_errors: true
    - name: Save the result for the test
      ansible.builtin.copy:
        content: "{{{{ warm_result | to_json }}}}"
        dest: "{dest}"
        mode: "0600"
      check_mode: false
"""


def run_warm(tmp_path: Path, args: dict, check: bool = False) -> dict:
    dest = tmp_path / f"warm-{len(list(tmp_path.glob('warm-*')))}.json"
    playbook = tmp_path / "warm.yml"
    playbook.write_text(PLAYBOOK.format(args=json.dumps(args), dest=dest))
    cmd = [ansible_bin("ansible-playbook"), "-i", "localhost,", str(playbook),
           "-e", json.dumps({"ansible_python_interpreter": sys.executable})]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, cwd=REPO, env=ansible_env(tmp_path), capture_output=True, text=True, timeout=180)
    assert dest.exists(), f"rc {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(dest.read_text())
    result["_rc"] = proc.returncode
    return result


@pytest.fixture
def warm_files(tmp_path):
    text = tmp_path / "system-prompt.txt"
    text.write_text("You are a careful assistant for the fleet. " * 40)
    ids = tmp_path / "agent-prefix.json"
    ids.write_text(json.dumps({"input_ids": [(7 * i) % 5000 + 10 for i in range(3000)]}))
    return text, ids


@pytest.mark.skipif(not sim_available(), reason="the simulator (sim/sglang_sim) is not in this tree")
def test_warm_set_is_sent_once_and_a_second_send_is_a_cache_hit(start_sim, tmp_path, warm_files):
    sim = start_sim(SEED_ARGS + HICACHE_ARGS)
    text, ids = warm_files
    args = {"url": sim.url, "files": [str(text), str(ids)], "request_timeout": 30}
    first = run_warm(tmp_path, args)
    assert first["_rc"] == 0, first.get("msg")
    assert not first.get("failed"), first.get("msg")
    assert first["changed"] is False
    assert [f["ok"] for f in first["files"]] == [True, True]
    by_file = {Path(f["file"]).name: f for f in first["files"]}
    assert by_file["agent-prefix.json"]["tokens"] == 3000
    assert by_file["system-prompt.txt"]["tokens"] > 100
    assert all(f["cached_tokens"] == 0 for f in first["files"])
    assert first["warm_tokens"] == sum(f["tokens"] for f in first["files"])
    assert first["sent"] == 2
    assert first["failed_files"] == []
    assert first["seconds"] >= 0
    assert first["msg"].startswith(f"warmed 2 of 2 files: {first['warm_tokens']} tokens (0 already cached)")
    second = run_warm(tmp_path, args)
    hit = {Path(f["file"]).name: f for f in second["files"]}["agent-prefix.json"]
    assert hit["cached_tokens"] >= 2990
    assert hit["device_cached_tokens"] == hit["cached_tokens"]
    assert second["cached_tokens"] >= 2990


def test_unreachable_server_is_reported_not_failed(tmp_path, warm_files):
    text, ids = warm_files
    url = f"http://127.0.0.1:{free_port()}"
    result = run_warm(tmp_path, {"url": url, "files": [str(text), str(ids)], "request_timeout": 5})
    assert result["_rc"] == 0
    assert result.get("failed") is False
    assert [f["ok"] for f in result["files"]] == [False, False]
    assert "connection refused" in result["files"][0]["error"]
    assert result["failed_files"] == [str(text), str(ids)]
    assert result["warm_tokens"] == 0
    assert any("was not warmed" in w and "connection refused" in w for w in result["warnings"])
    assert "not warmed:" in result["msg"]


def test_check_mode_sends_nothing(tmp_path, warm_files):
    from probe_fakes import FakeServer

    text, ids = warm_files
    with FakeServer() as server:
        result = run_warm(tmp_path, {"url": server.url, "files": [str(text), str(ids)]}, check=True)
    assert result["_rc"] == 0
    assert result["sent"] == 0
    assert server.requests == []
    assert [p["kind"] for p in result["plan"]] == ["text", "input_ids"]
    assert result["plan"][1]["input_ids"] == 3000


def test_bad_options_fail_naming_them(tmp_path, warm_files):
    text, _ = warm_files
    result = run_warm(tmp_path, {"files": [str(text)], "max_new_tokens": 0, "total_timeout": 0})
    assert result["failed"]
    assert "max_new_tokens must be at least 1" in result["msg"]
    assert "total_timeout must be" in result["msg"]
    missing = run_warm(tmp_path, {"files": [str(tmp_path / "nope.txt")]})
    assert missing["failed"]
    assert "files: cannot read" in missing["msg"]
    assert "nope.txt" in missing["msg"]


def test_files_are_checked(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"input_ids": [1, "two"]}))
    with pytest.raises(ProbeError, match="holds no token ids"):
        load_prompt(str(bad))
    ids = tmp_path / "ids.json"
    ids.write_text("[1, 2, 3]")
    assert load_prompt(str(ids)) == {"input_ids": [1, 2, 3]}
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(ProbeError, match="is empty"):
        load_prompt(str(empty))
    body = json.loads(warm_body({"text": "hi"}, 1))
    assert body["text"] == "hi"
    assert body["sampling_params"]["max_new_tokens"] == 1
    assert body["stream"] is True
    assert validate_params({"files": [], "max_new_tokens": 1, "request_timeout": 1.0, "total_timeout": 1.0})


def test_total_timeout_skips_the_rest_and_says_so(tmp_path):
    from probe_fakes import FakeServer

    ticks = iter([0.0, 0.0, 5.0, 5.0, 5.0])
    with FakeServer() as server:
        p = {"url": server.url, "api_key": None, "max_new_tokens": 1, "request_timeout": 10.0, "total_timeout": 2.0}
        result = send_warm_set(p, [("a", {"input_ids": [1, 2, 3]}), ("b", {"input_ids": [4, 5]})],
                               clock=lambda: next(ticks))
    assert [f["ok"] for f in result["files"]] == [True, False]
    assert result["files"][1]["error"] == "not sent: total_timeout 2 s ran out"
    assert result["sent"] == 1
    assert len(server.state.generate_bodies) == 1
