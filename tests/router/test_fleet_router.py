"""library/fleet_router.py (the rollout's router membership in one call) against a fake router on
127.0.0.1 (router_fakes.FakeRouter): as functions (module_utils/fleet_router.py) and through Ansible,
the module alone and the entry points check, leave and join of roles/rollout_router."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible.module_utils.fleet_router import (
    ARGUMENT_SPEC,
    MAX_BODY_BYTES,
    Answer,
    RouterError,
    check_params,
    run,
    seen,
    worker_url,
    workers_of,
)
from plugins import load
from procs import free_port

REPO = Path(__file__).resolve().parents[2]
KEY = "router-Key-5Zq"
PORTS = {"main": 30004, "draft": 30005}
HOST = "127.0.0.9"
URLS = {"main": f"http://{HOST}:30004", "draft": f"http://{HOST}:30005"}
ROUTER_FILTERS = load("roles/router/filter_plugins/router.py")


def params(url: str, **over) -> dict:
    p = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    p.update(url=url, api_key=KEY, ports=dict(PORTS), worker_host=HOST, wait_s=5, drain_grace_s=0,
             poll_interval=0.05, timeout=5.0)
    p.update(over)
    assert check_params(p) == []
    return p


# --- out ------------------------------------------------------------------------------------------

def test_out_takes_the_leaving_instances_out_waits_until_gone_then_the_grace(fake_router):
    main_id = fake_router.add(URLS["main"])
    fake_router.add(URLS["draft"])
    fake_router.add("http://other:30004")
    fake_router.delete_lag = 2  # the router lists it twice more after the DELETE
    slept = []
    result = run(params(fake_router.url, state="out", names=["main"], drain_grace_s=7),
                 sleep=lambda s: slept.append(s) or time.sleep(min(s, 0.05)))
    assert result["changed"] is True
    assert result["events"] == [f"left {URLS['main']}"]
    assert result["removed"] == ["main"]
    assert result["urls"] == URLS
    assert fake_router.listed() == sorted([URLS["draft"], "http://other:30004"])
    assert fake_router.methods() == ["GET /workers", f"DELETE /workers/{main_id}", "GET /workers",
                                     "GET /workers", "GET /workers"]
    assert slept[-1] == 7  # the drain grace, after the router stopped listing it
    assert {r["authorization"] for r in fake_router.requests} == {f"Bearer {KEY}"}


def test_out_of_instances_the_router_does_not_list_changes_nothing(fake_router):
    fake_router.add("http://other:30004")
    result = run(params(fake_router.url, state="out", names=["main", "draft"], drain_grace_s=30))
    assert result["changed"] is False
    assert result["events"] == []
    assert result["removed"] == []
    assert fake_router.methods() == ["GET /workers"]


def test_worker_ids_with_slash_query_and_fragment_are_escaped_whole(fake_router):
    hostile = "../../admin?x=1#y /z"
    fake_router.add(URLS["main"], wid=hostile)
    result = run(params(fake_router.url, state="out", names=["main"]))
    assert result["removed"] == ["main"]
    assert fake_router.requests[1]["method"] == "DELETE"
    assert fake_router.requests[1]["path"] == "/workers/..%2F..%2Fadmin%3Fx%3D1%23y%20%2Fz"
    assert fake_router.listed() == []


@pytest.mark.parametrize("url_of", [worker_url, ROUTER_FILTERS.router_worker_url])
def test_the_module_and_the_router_role_escape_ids_alike(url_of):
    assert url_of("http://r:30000/", "abc-1") == "http://r:30000/workers/abc-1"
    hostile = url_of("http://r:30000", "../../admin?x=1#y /z\r\n")
    assert hostile == "http://r:30000/workers/..%2F..%2Fadmin%3Fx%3D1%23y%20%2Fz%0D%0A"


def test_a_5xx_during_the_gone_poll_is_never_gone_and_fails_at_the_deadline(fake_router):
    fake_router.add(URLS["main"])
    fake_router.get_fault, fake_router.get_fault_from = "503", 2  # the first GET answers, every poll 503
    start = time.monotonic()
    with pytest.raises(RouterError) as err:
        run(params(fake_router.url, state="out", names=["main"], wait_s=2, poll_interval=0.2))
    took = time.monotonic() - start
    assert 1.5 < took < 4, took  # the polls go on until the deadline (less the last poll's share)
    msg = str(err.value)
    assert msg.startswith(f"After 2 s (rollout_router_wait_s) the router at {fake_router.url} still lists "
                          f"{URLS['main']}. (Its last GET /workers, poll ")
    assert "HTTP 503 (upstream unavailable); only a 200 with a list of workers counts, a 5xx is never taken" in msg
    assert err.value.result["events"] == [f"left {URLS['main']}"]  # the DELETE went out
    assert err.value.result["status"] == 503
    assert "removed" in err.value.result
    assert err.value.result["removed"] == []  # only once the router no longer lists it


def test_a_200_without_a_list_of_workers_is_no_answer(fake_router):
    fake_router.add(URLS["main"])
    fake_router.get_fault = "not_a_list"
    with pytest.raises(RouterError, match=r"did not list its workers .*HTTP 200 without a JSON object with a list"):
        run(params(fake_router.url, state="out", names=["main"]))


@pytest.mark.parametrize("answer", [
    Answer(503, b'{"workers": []}'), Answer(500), Answer(302, b'{"workers": []}'),
    Answer(200, b'{"workers": "none"}'), Answer(200, b'{"workers": {"url": "http://h:30004"}}'),
    Answer(200, b'["http://h:30004"]'), Answer(200, b"not json"), None,
])
def test_a_poll_that_is_no_200_with_a_list_is_never_gone_nor_healthy(answer):
    urls = ["http://h:30004", "http://h:30005"]
    assert seen(workers_of(answer), "gone", urls) == urls
    assert seen(workers_of(answer), "healthy", urls) == []


def test_a_200_with_a_list_says_what_is_listed_and_healthy():
    urls = ["http://h:30004", "http://h:30005"]
    body = json.dumps({"workers": [{"url": "http://h:30004", "is_healthy": False},
                                   {"url": "http://h:30005/", "is_healthy": True},
                                   "junk", {"url": "http://other:1", "is_healthy": True}]}).encode()
    assert seen(workers_of(Answer(200, body)), "gone", urls) == urls
    assert seen(workers_of(Answer(200, body)), "healthy", urls) == ["http://h:30005"]
    assert seen(workers_of(Answer(200, b'{"workers": []}')), "gone", urls) == []


# --- in -------------------------------------------------------------------------------------------

def test_in_adds_the_missing_ones_and_waits_until_listed_healthy(fake_router):
    fake_router.add(URLS["draft"])
    fake_router.healthy_after = 3
    result = run(params(fake_router.url, state="in"))
    assert result["changed"] is True
    assert result["added"] == ["main"]
    assert result["events"] == [f"joined {URLS['main']}"]
    posts = [r for r in fake_router.requests if r["method"] == "POST"]
    assert [json.loads(r["body"]) for r in posts] == [{"url": URLS["main"]}]
    assert all(w["is_healthy"] for w in fake_router.workers.values())
    assert fake_router.methods().count("GET /workers") == 5  # the list, then until healthy


def test_in_when_already_listed_is_no_change_and_sends_nothing(fake_router):
    fake_router.add(URLS["main"])
    fake_router.add(URLS["draft"] + "/")  # the router may keep a trailing slash
    result = run(params(fake_router.url, state="in"))
    assert result["changed"] is False
    assert result["events"] == []
    assert fake_router.methods() == ["GET /workers"]


def test_in_names_only_those_given(fake_router):
    result = run(params(fake_router.url, state="in", names=["draft"]))
    assert result["added"] == ["draft"]
    assert fake_router.listed() == [URLS["draft"]]


def test_in_never_healthy_fails_at_the_deadline_naming_what_is_healthy(fake_router):
    fake_router.healthy_after = 10_000
    with pytest.raises(RouterError) as err:
        run(params(fake_router.url, state="in", wait_s=1))
    assert str(err.value).startswith(
        f"After 1 s (rollout_router_wait_s) the router at {fake_router.url} lists as healthy only [] of "
        f"{URLS['main']}, {URLS['draft']}. (Its last GET /workers, poll ")
    assert (f"HTTP 200, 2 workers: {URLS['main']} (not healthy), {URLS['draft']} (not healthy); only a 200"
            in str(err.value))


def test_a_refused_post_names_the_status_and_the_router_text_escaped(fake_router):
    fake_router.post_status = 500
    with pytest.raises(RouterError) as err:
        run(params(fake_router.url, state="in", names=["main"]))
    assert str(err.value).startswith(f"POST {fake_router.url}/workers (url {URLS['main']}) answered HTTP 500")
    assert err.value.result["status"] == 500


# --- check mode -----------------------------------------------------------------------------------

def test_check_mode_says_what_it_would_do_and_sends_no_delete_nor_post(fake_router):
    fake_router.add(URLS["main"])
    out = run(params(fake_router.url, state="out", names=["main"], drain_grace_s=30), check_mode=True)
    assert out["changed"] is True
    assert out["events"] == [f"would leave {URLS['main']}"]
    assert out["removed"] == []
    joined = run(params(fake_router.url, state="in"), check_mode=True)
    assert joined["changed"] is True
    assert joined["events"] == [f"would join {URLS['draft']}"]
    assert fake_router.methods() == ["GET /workers", "GET /workers"]
    assert fake_router.listed() == [URLS["main"]]


# --- a router that misbehaves ---------------------------------------------------------------------

def test_a_redirect_is_not_followed_and_the_key_goes_nowhere_else(fake_router, other_server):
    fake_router.get_fault, fake_router.redirect_to = "redirect", other_server.url
    with pytest.raises(RouterError) as err:
        run(params(fake_router.url, state="read"))
    assert f"HTTP 302 (a redirect to {other_server.url}/workers, not followed)" in str(err.value)
    assert other_server.requests == []
    # during the polls too: a redirect is not gone, and not followed
    fake_router.get_fault, fake_router.get_fault_from = None, 1
    fake_router.add(URLS["main"])
    fake_router.gets = 0
    fake_router.get_fault, fake_router.get_fault_from = "redirect", 2
    with pytest.raises(RouterError, match=r"still lists .*HTTP 302 \(a redirect to"):
        run(params(fake_router.url, state="out", names=["main"], wait_s=1))
    assert other_server.requests == []


def test_an_oversized_answer_fails_bounded_with_an_escaped_message(fake_router):
    fake_router.get_fault = "huge"
    with pytest.raises(RouterError) as err:
        run(params(fake_router.url, state="read"))
    msg = str(err.value)
    assert f"GET {fake_router.url}/workers answered more than {MAX_BODY_BYTES} bytes" in msg
    assert "\x1b" not in msg
    assert len(msg) < 800


def test_the_routers_error_text_is_stripped_of_control_characters_and_cut(fake_router):
    fake_router.get_fault = "control"
    with pytest.raises(RouterError) as err:
        run(params(fake_router.url, state="read"))
    msg = str(err.value)
    assert "HTTP 500 (boom [0m FAKE-LOG-LINE xxx" in msg.replace("[31m", "")
    assert not any(ch in msg for ch in "\x1b\r\n")
    assert len(msg) < 800


def test_a_dripping_router_is_cut_at_the_request_deadline(fake_router):
    fake_router.get_fault = "drip"
    start = time.monotonic()
    with pytest.raises(RouterError, match=r"no complete answer within 1\.5 s"):
        run(params(fake_router.url, state="read", timeout=1.5))
    assert time.monotonic() - start < 3


def test_a_dripping_router_during_the_polls_is_cut_at_the_overall_deadline(fake_router):
    fake_router.add(URLS["main"])
    fake_router.get_fault, fake_router.get_fault_from = "drip", 2
    start = time.monotonic()
    with pytest.raises(RouterError) as err:
        run(params(fake_router.url, state="out", names=["main"], wait_s=2, timeout=30.0))
    took = time.monotonic() - start
    assert took < 3.5, took  # wait_s, not the 30 s of one request
    assert "After 2 s (rollout_router_wait_s)" in str(err.value)
    assert "no complete answer within" in str(err.value)


def test_a_router_that_is_not_there(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RouterError) as err:
        run(params(url, state="read"))
    assert str(err.value).startswith(f"The router at rollout_router_url={url} did not list its workers from ")
    assert "ConnectionRefusedError" in str(err.value)
    assert "rollout_router_api_key if it requires one" in str(err.value)


# --- options refused before any request -----------------------------------------------------------

@pytest.mark.parametrize(("over", "says"), [
    ({"url": "http://ops:pw-Secret@127.0.0.1:9"}, 'rollout_router_url="http://127.0.0.1:9" is not a router base URL'),
    ({"url": "http://127.0.0.1:9/v1"}, "is not a router base URL"),
    ({"api_key": "k3y\n"}, "rollout_router_api_key contains whitespace"),
    ({"api_key": "k 3y"}, "(the value is not shown)"),
    ({"names": ["nope"]}, "names nope are not among this host's instances (draft, main"),
    ({"wait_s": 0}, "rollout_router_wait_s=0 must be at least 1 second"),
    ({"worker_host": ""}, "worker_host (rollout_router_worker_host) is empty"),
])
def test_bad_options_are_refused_naming_the_variable_never_the_secret(over, says):
    p = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    p.update(url="http://127.0.0.1:9", ports=dict(PORTS), worker_host=HOST, state="out")
    p.update(over)
    errors = " ".join(check_params(p))
    assert says in errors
    assert "pw-Secret" not in errors
    assert "k3y" not in errors


def test_an_ipv6_worker_host_is_bracketed():
    from ansible.module_utils.fleet_router import instance_urls
    assert instance_urls({"m": 1}, "https", "fd00::2") == {"m": "https://[fd00::2]:1"}
    assert instance_urls({"m": 1}, "http", "[fd00::2]") == {"m": "http://[fd00::2]:1"}


# --- through Ansible ------------------------------------------------------------------------------

def ansible_env(tmp_path: Path) -> dict:
    env = dict(os.environ)
    env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(REPO / "roles"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"), ANSIBLE_REMOTE_TMP=str(tmp_path / "ansible-remote"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="0", ANSIBLE_RETRY_FILES_ENABLED="0",
               ANSIBLE_FACT_CACHING="memory")
    return env


def play(tmp_path: Path, tasks: str, variables: dict, check: bool = False) -> tuple[subprocess.CompletedProcess, dict]:
    dest = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}.json"
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n" + tasks
                        + f"""
    - name: Save the facts for the test
      ansible.builtin.copy:
        content: "{{{{ {{'workers': _rollout_router_workers | default(none),
                      'urls': _rollout_router_urls | default(none),
                      'removed': _rollout_router_removed | default(none),
                      'events': _rollout_router_events | default(none),
                      'call': _rollout_router_call | default(none)}} | to_json }}}}"
        dest: "{dest}"
        mode: "0600"
      delegate_to: localhost
      check_mode: false
""")
    variables = {"ansible_python_interpreter": sys.executable, **variables}
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-v", "-i", "gpu-1,", "-c", "local",
           str(playbook), "-e", json.dumps(variables)]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, env=ansible_env(tmp_path), capture_output=True, text=True, timeout=240,
                          check=False, cwd=REPO)
    facts = json.loads(dest.read_text()) if dest.exists() else {}
    return proc, facts


ROLE_VARS = {"rollout_router_api_key": KEY, "rollout_router_worker_host": HOST, "rollout_router_wait_s": 10,
             "rollout_router_drain_grace_s": 0,
             "sglang_service_deployed": [{"name": n, "port": p, "unit": f"sglang-{n}.service"}
                                         for n, p in PORTS.items()]}


def role(entry: str, **extra: object) -> str:
    vars_ = "".join(f"\n        {k}: {json.dumps(v)}" for k, v in extra.items())
    return (f"    - ansible.builtin.include_role: {{name: rollout_router, tasks_from: {entry}}}\n"
            + (f"      vars:{vars_}\n" if extra else ""))


def test_the_role_entry_points_out_and_back_in_with_two_tasks_each(tmp_path, fake_router):
    fake_router.add(URLS["main"])
    fake_router.add(URLS["draft"])
    fake_router.add("http://other:30004")
    tasks = role("check") + role("leave") + role("join", rollout_router_names=["main"])
    proc, facts = play(tmp_path, tasks, {**ROLE_VARS, "rollout_router_url": fake_router.url,
                                         "rollout_router_leaving": ["main"]})
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-4000:]
    assert facts["removed"] == ["main"]
    assert facts["events"] == [f"left {URLS['main']}", f"joined {URLS['main']}"]
    assert facts["urls"] == URLS
    assert sorted(w["url"] for w in facts["workers"]) == sorted([URLS["draft"], "http://other:30004"])
    assert fake_router.listed() == sorted([*URLS.values(), "http://other:30004"])
    methods = [m.split(" ")[0] for m in fake_router.methods()]
    assert methods.count("DELETE") == 1
    assert methods.count("POST") == 1
    # check: assert, call, set_fact; out and in: the call and a set_fact each
    tasks_run = [line for line in proc.stdout.splitlines() if line.startswith("TASK [")]
    assert len([t for t in tasks_run if "Router |" in t]) == 3 + 2 + 2, tasks_run
    assert KEY not in said


def test_check_mode_through_the_role_sends_nothing_and_says_what_it_would_do(tmp_path, fake_router):
    fake_router.add(URLS["main"])
    tasks = role("leave") + role("join")
    proc, facts = play(tmp_path, tasks, {**ROLE_VARS, "rollout_router_url": fake_router.url,
                                         "rollout_router_leaving": ["main"]}, check=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert facts["removed"] == []
    assert facts["events"] == [f"would leave {URLS['main']}", f"would join {URLS['draft']}"]
    assert fake_router.methods() == ["GET /workers", "GET /workers"]
    assert "changed: [gpu-1" in proc.stdout


def test_a_failure_through_ansible_names_the_router_and_never_the_key(tmp_path, fake_router):
    fake_router.add(URLS["main"])
    fake_router.get_fault, fake_router.get_fault_from = "503", 2
    proc, _ = play(tmp_path, role("leave"), {**ROLE_VARS, "rollout_router_url": fake_router.url,
                                                  "rollout_router_leaving": ["main"], "rollout_router_wait_s": 1})
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0
    assert f"After 1 s (rollout_router_wait_s) the router at {fake_router.url} still lists {URLS['main']}" in said
    assert "HTTP 503" in said
    assert KEY not in said


def test_a_key_with_a_newline_is_refused_without_showing_it(tmp_path, fake_router):
    secret = "nl-Secret-9Tq"  # noqa: S105 (a test key)
    proc, _ = play(tmp_path, role("check"), {**ROLE_VARS, "rollout_router_url": fake_router.url,
                                                    "rollout_router_api_key": secret + "\n"})
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "rollout_router_api_key contains whitespace" in " ".join(said.split())
    assert secret not in said
    assert fake_router.requests == []


# What molecule/rollout's side effect ran as two whole runs before (a router that does not answer, a
# URL that is not a router's base URL): rollout_router check refuses each, naming rollout_router_url and what
# to check. playbooks/rollout.yml runs it in a play before any host's stage.
@pytest.mark.parametrize(("url", "said"), [
    ("http://127.0.0.9:9", "did not list its workers"),
    ("127.0.0.9:30100", "is not a router base URL"),
])
def test_router_check_refuses_a_router_that_does_not_answer_or_a_bad_url(tmp_path, url, said):
    proc, _ = play(tmp_path, role("check"), {**ROLE_VARS, "rollout_router_url": url,
                                                    "rollout_router_wait_s": 2})
    output = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0
    assert said in output
    assert "rollout_router_url" in output
    assert KEY not in output
