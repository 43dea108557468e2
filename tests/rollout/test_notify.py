"""Issue 28 item 3: one message per run, when it ends, to rollout_notify_url; never a secret; a webhook
that fails is a warning and a report line, never a failed run.

The real callback_plugins/rollout_outcome.py, fed what Ansible gives it (the play, whose variable
manager reads a real inventory with seeded secrets; the fact naming the run directory; the stats),
renders the real report (roles/rollout/files/fleet_report.py) and posts to a local HTTP receiver on
127.0.0.1 that this test starts and stops (a thread of this process)."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "roles" / "rollout" / "files" / "fleet_report.py"
rollout_filters = load("roles/rollout/filter_plugins/rollout.py", "rollout_filters_notify")

# Seeded into the inventory; none may appear in any message.
SECRETS = {
    "sglang_service_api_key": "sk-SEEDED-api-key-7f3a9c",
    "rollout_router_api_key": "SEEDED-router-key-41b2",
    "models_hf_token": "hf_SEEDEDtoken0000000000",
    "vault_db_password": "SEEDED-pass-w0rd",
}
URL_PASSWORD = "SEEDED-urlpass-55"  # noqa: S105 (a seeded test secret)
HEADER_TOKEN = "SEEDED-bearer-9d8e"  # noqa: S105 (a seeded test secret)
PATH_TOKEN = "T000SEEDED/B000/xoxwebhooksecret"  # noqa: S105 (a seeded test secret)


def callback_module():
    path = ROOT / "callback_plugins" / "rollout_outcome.py"
    spec = importlib.util.spec_from_file_location("rollout_outcome_notify", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Receiver:
    """A webhook on 127.0.0.1: records every POST; answers `status`, after `delay` seconds."""

    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        self.bodies: list[bytes] = []
        self.headers: list[dict] = []
        self.paths: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                outer.bodies.append(self.rfile.read(length))
                outer.headers.append(dict(self.headers))
                outer.paths.append(self.path)
                time.sleep(delay)
                try:
                    self.send_response(status)
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.port = self.server.server_address[1]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive()


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def start(status: int = 200, delay: float = 0.0) -> Receiver:
        made.append(Receiver(status, delay))
        return made[-1]

    yield start
    for one in made:
        one.stop()


class Display:
    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.lines: list[str] = []

    def warning(self, text: str) -> None:
        self.warnings.append(text)

    def display(self, text: str) -> None:
        self.lines.append(text)

    def banner(self, text: str) -> None:
        self.lines.append(text)


class Stats:
    def __init__(self, unreachable: tuple[str, ...] = ()) -> None:
        self.unreachable = unreachable

    def summarize(self, host: str) -> dict:
        return {"unreachable": int(host in self.unreachable), "failures": 0}


def record(host: str, order: int, verdict: str, reasons: list[str] | None = None) -> dict:
    return {"host": host, "order": order, "verdict": verdict, "config_hash": "a" * 64, "probe": {},
            "reasons": reasons or []}


# The three verdicts a run ends with: every host passed; a host failed its gate and was rolled back
# (its reason quotes a secret and a URL with credentials, as a server's error text might); a host was
# unreachable in its batch (the playbook ended there, no record, the rest not reached).
RUNS = {
    "passed": ([record("h1", 0, "passed"), record("h2", 1, "passed"), record("h3", 2, "unchanged")], ()),
    "rolled back": (
        [record("h1", 0, "passed"),
         record("h2", 1, "rolled back", [f"probe failed: 401 with key {SECRETS['sglang_service_api_key']} at "
                                         f"http://admin:{URL_PASSWORD}@127.0.0.1:30000/generate"])],
        (),
    ),
    "halted": ([record("h1", 0, "passed")], ("h2",)),
}


def run_once(tmp_path: Path, name: str, notify: dict, records: list[dict], unreachable: tuple[str, ...] = (),
             check_mode: bool = False, paused: dict | None = None):
    """One run end: an inventory (seeded secrets + notify settings), run.json as open writes it, the
    hosts' records, then the callback's events. Returns (run_dir, display)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook.play import Play
    from ansible.vars.manager import VariableManager

    base = tmp_path / name.replace(" ", "_")
    inventory = base / "inventory"
    (inventory / "group_vars" / "sglang_hosts").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"sglang_hosts": {"hosts": {"h1": {}, "h2": {}, "h3": {}}}}))
    group_vars = {
        **SECRETS,
        # A templated secret, as an inventory refers to a vault variable.
        "rollout_router_url": f"http://ops:{URL_PASSWORD}@127.0.0.1:30000",
        **notify,
    }
    (inventory / "group_vars" / "sglang_hosts" / "fleet.yml").write_text(yaml.safe_dump(group_vars))
    run_dir = base / "reports" / "20261203T000000Z"
    (run_dir / "hosts").mkdir(parents=True)
    run = {"run_id": run_dir.name, "inventory": "inventories/test", "hosts": ["h1", "h2", "h3"],
           "check_mode": check_mode, "locked": [], "note": "",
           "lock": {"run_id": run_dir.name, "controller": "c", "pid": os.getpid(), "started": "2026-12-03T00:00:00Z"},
           "lock_paths": {"controller": str(base / "controller.lock")},
           "report_command": [sys.executable, str(REPORT), "rollout"]}
    (run_dir / "run.json").write_text(json.dumps(run))
    for one in records:
        (run_dir / "hosts" / f"{one['host']}.json").write_text(json.dumps(one))
    if paused is not None:
        (run_dir / "paused.json").write_text(json.dumps(paused))

    loader = DataLoader()
    hosts = InventoryManager(loader=loader, sources=[str(inventory / "hosts.yml")])
    manager = VariableManager(loader=loader, inventory=hosts)
    play = Play.load({"hosts": "sglang_hosts", "gather_facts": False, "tasks": []},
                     variable_manager=manager, loader=loader)

    module = callback_module()
    callback = module.CallbackModule()
    display = Display()
    callback._display = display
    callback.v2_playbook_on_play_start(play)
    callback.v2_runner_on_ok(SimpleNamespace(_result={"ansible_facts": {"rollout_run_dir": str(run_dir)}}))
    callback.v2_playbook_on_stats(Stats(unreachable))
    return run_dir, display


def url(rx: Receiver, path: str = "/hook") -> str:
    return f"http://127.0.0.1:{rx.port}{path}"


def no_secret_in(text: str) -> None:
    for secret in [*SECRETS.values(), URL_PASSWORD, HEADER_TOKEN, PATH_TOKEN]:
        assert secret not in text


@pytest.mark.parametrize("fmt", ["json", "slack"])
@pytest.mark.parametrize("name", list(RUNS))
def test_one_message_per_verdict_and_no_secret_in_it(tmp_path, receiver, name, fmt):
    rx = receiver()
    records, unreachable = RUNS[name]
    notify = {"rollout_notify_url": url(rx, f"/services/{PATH_TOKEN}"), "rollout_notify_format": fmt,
              "rollout_notify_headers": {"Authorization": f"Bearer {HEADER_TOKEN}"}}
    run_dir, display = run_once(tmp_path, name, notify, records, unreachable)
    assert len(rx.bodies) == 1, rx.bodies
    body = rx.bodies[0].decode()
    no_secret_in(body)
    assert rx.headers[0]["Authorization"] == f"Bearer {HEADER_TOKEN}"  # sent as a header, not in the body
    message = json.loads(body)
    report = json.loads((run_dir / "rollout.json").read_text())
    if fmt == "json":
        assert message["verdict"] == name
        assert message["summary"] == report["run"]["verdict"]
        assert message["run_id"] == run_dir.name
        assert message["inventory"] == "inventories/test"
        assert message["report"] == str(run_dir / "rollout.md")
        assert message["started"] == "2026-12-03T00:00:00Z"
        assert message["ended"]
        if name == "passed":
            assert message["hosts"] == {"passed": ["h1", "h2"], "failed": [], "unchanged": ["h3"], "not_reached": []}
            assert message["halting_host"] is None
        if name == "rolled back":
            assert message["halting_host"] == "h2"
            assert message["hosts"]["failed"] == ["h2"]
            assert "(redacted)" in message["halting_reason"]
            assert "http://(credentials)@127.0.0.1:30000/generate" in message["halting_reason"]
        if name == "halted":
            assert message["halting_host"] == "h2"
            assert message["hosts"]["failed"] == ["h2"]
            assert message["hosts"]["not_reached"] == ["h3"]
    else:
        assert message["text"].endswith(f": {name}")
        assert run_dir.name in message["text"]
        section = message["blocks"][1]["text"]["text"]
        assert str(run_dir / "rollout.md") in section
        if name != "passed":
            assert "halted at *h2*" in section
    md = (run_dir / "rollout.md").read_text()
    assert f"notify: sent ({fmt}, HTTP 200)" in md
    # What this feature writes (the host records, seeded with a secret above, are the gate's).
    no_secret_in((run_dir / "outcome.json").read_text() + " ".join(display.lines))
    assert not display.warnings


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("failure", ["refused", "500", "timeout"])
def test_a_failing_webhook_is_a_warning_and_a_report_line_never_a_changed_result(tmp_path, receiver, failure):
    if failure == "refused":
        target = f"http://127.0.0.1:{closed_port()}/services/{PATH_TOKEN}"
        rx = None
    else:
        rx = receiver(status=500) if failure == "500" else receiver(delay=3)
        target = url(rx, f"/services/{PATH_TOKEN}")
    records, unreachable = RUNS["rolled back"]
    started = time.monotonic()
    run_dir, display = run_once(tmp_path, failure, {"rollout_notify_url": target, "rollout_notify_timeout_s": 1},
                                records, unreachable)
    assert time.monotonic() - started < 30
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["notify"].startswith("failed (json, ")
    expected = {"refused": "Connection refused", "500": "HTTP 500", "timeout": "timed out"}[failure]
    assert expected in outcome["notify"]
    md = (run_dir / "rollout.md").read_text()
    notify_line = next(line for line in md.splitlines() if line.startswith("notify: "))
    assert notify_line.startswith("notify: failed (json, ")
    assert expected in notify_line
    # The run's result is the same: the verdict of a run that was rolled back, the lock released.
    assert "halted: h2 failed and was rolled back" in md
    assert outcome["locks"]["controller_released_at_end"] is False  # no controller lock file in this fake
    assert len(display.warnings) == 1
    assert display.warnings[0].startswith("notify: failed (json, ")
    no_secret_in(" ".join(display.warnings + display.lines) + (run_dir / "outcome.json").read_text())
    if rx is not None:
        assert len(rx.bodies) == 1


def test_no_url_no_message_and_no_notify_line(tmp_path, receiver):
    rx = receiver()
    run_dir, _display = run_once(tmp_path, "off", {}, *RUNS["passed"])
    assert rx.bodies == []
    assert "notify:" not in (run_dir / "rollout.md").read_text()
    assert "notify" not in json.loads((run_dir / "outcome.json").read_text())


def test_check_mode_sends_nothing(tmp_path, receiver):
    rx = receiver()
    run_dir, _display = run_once(tmp_path, "check", {"rollout_notify_url": url(rx)}, *RUNS["passed"], check_mode=True)
    assert rx.bodies == []
    assert "check mode" in (run_dir / "rollout.md").read_text()


def test_the_callbacks_defaults_are_the_roles():
    defaults = yaml.safe_load((ROOT / "roles" / "rollout" / "defaults" / "main.yml").read_text())
    module = callback_module()
    assert {name: defaults[name] for name in module.NOTIFY_DEFAULTS} == module.NOTIFY_DEFAULTS


@pytest.mark.parametrize(
    ("value", "timeout", "wrong"),
    [
        ("", 10, []),
        ("https://hooks.example.test/services/T0/B0/xyz", 10, []),
        ("http://127.0.0.1:8080", 1, []),
        (f"https://user:{URL_PASSWORD}@hooks.example.test/x", 10, ["rollout_notify_url"]),
        ("ftp://hooks.example.test/x", 10, ["rollout_notify_url"]),
        ("hooks.example.test/x", 120, ["rollout_notify_url"]),
        ("https://hooks.example.test/x", 0, ["rollout_notify_timeout_s"]),
        ("https://hooks.example.test/x", 121, ["rollout_notify_timeout_s"]),
    ],
)
def test_notify_settings_are_checked_naming_the_variable_never_the_url(value, timeout, wrong):
    errors = rollout_filters.rollout_notify_errors(value, timeout)
    assert [error.split(" ")[0].split("=")[0] for error in errors] == wrong
    assert all(URL_PASSWORD not in error and "hooks.example" not in error for error in errors)


# --- As Ansible runs it: the real `open` on localhost (as tests/rollout/test_lock_play.py runs it), the
# run ending there, the real callback posting; secrets seeded in the inventory and passed with -e.
OPEN_PLAYBOOK = """
- name: Open a run as playbooks/rollout.yml does
  hosts: sglang_hosts
  gather_facts: false
  tasks:
    - name: Open
      ansible.builtin.include_role: {name: rollout, tasks_from: open}
"""


def ansible_open(tmp_path: Path, notify: dict) -> subprocess.CompletedProcess:
    state, reports = tmp_path / "state", tmp_path / "reports"
    (tmp_path / "site.yml").write_text(OPEN_PLAYBOOK, encoding="utf-8")
    host = {"ansible_connection": "local", "ansible_host": "127.0.0.1", "ansible_python_interpreter": sys.executable}
    inventory = {"sglang_hosts": {"hosts": {"node-1": host}, "vars": {**SECRETS, **notify}}}
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory), encoding="utf-8")
    variables = {
        "_rollout_host_state_dir": str(state),
        "rollout_lock_path": f"{state}/rollout.lock",
        "rollout_record_path": f"{state}/validated.json",
        "rollout_converged_path": f"{state}/converged.json",
        "rollout_report_dir": str(reports),
    }
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FACT_CACHING="memory")
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
         str(tmp_path / "site.yml"), "-e", json.dumps(variables), "-e", f"rollout_router_api_key={HEADER_TOKEN}"],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )


def test_a_real_run_end_posts_once_with_no_secret(tmp_path, receiver):
    rx = receiver()
    done = ansible_open(tmp_path, {"rollout_notify_url": url(rx, f"/services/{PATH_TOKEN}"),
                                   "rollout_notify_format": "slack"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert len(rx.bodies) == 1
    message = json.loads(rx.bodies[0])
    assert message["text"].startswith("hicache-fleet rollout ")
    no_secret_in(rx.bodies[0].decode() + done.stdout + done.stderr)
    assert "notify: sent (slack, HTTP 200)" in done.stdout
    (run_dir,) = [p for p in (tmp_path / "reports").iterdir() if p.is_dir()]
    assert "notify: sent (slack, HTTP 200)" in (run_dir / "rollout.md").read_text()


def test_a_url_with_credentials_refuses_the_run_before_the_lock_naming_the_variable_not_the_url(tmp_path, receiver):
    rx = receiver()
    done = ansible_open(tmp_path, {"rollout_notify_url": f"http://hook:{URL_PASSWORD}@127.0.0.1:{rx.port}/x"})
    assert done.returncode != 0
    assert "rollout_notify_url is not an http(s)://HOST[:PORT]/PATH URL without user:password@" in done.stdout
    no_secret_in(done.stdout + done.stderr)
    assert not (tmp_path / "state").exists()
    assert not (tmp_path / "reports").exists()
    assert rx.bodies == []


CHECK_PLAYBOOK = """
- name: The rollout role's argument check, as preflight runs it
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Check
      ansible.builtin.import_role: {name: rollout, tasks_from: argument_check, rolespec_validate: false}
    - name: Errors
      ansible.builtin.copy:
        content: "{{ rollout_argument_check.argument_errors | default([]) | to_json }}"
        dest: "{{ playbook_dir }}/errors.json"
        mode: "0600"
"""


def _argument_check(tmp_path, extra):
    """Preflight's argument check of every role (CHECK_PLAYBOOK) with `extra`: the run and its errors."""
    (tmp_path / "check.yml").write_text(CHECK_PLAYBOOK, encoding="utf-8")
    # Facts in memory (ANSIBLE_CACHE_PLUGIN): nothing of this run reaches .cache/facts.
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_CACHE_PLUGIN="memory")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}",
         str(tmp_path / "check.yml"), "-e", json.dumps(extra)],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    return done, json.loads((tmp_path / "errors.json").read_text())


@pytest.mark.parametrize(("extra", "wrong"), [
    ({}, []),
    ({"rollout_notify_url": f"https://u:{URL_PASSWORD}@127.0.0.1/x"}, ["rollout_notify_url"]),
    ({"rollout_notify_url": "https://127.0.0.1/x", "rollout_notify_timeout_s": 0}, ["rollout_notify_timeout_s"]),
    ({"rollout_notify_format": "teams"}, ["rollout_notify_format"]),
])
def test_preflights_argument_check_names_a_bad_notify_setting(tmp_path, extra, wrong):
    done, errors = _argument_check(tmp_path, extra)
    assert [name for name in wrong if not any(name in error for error in errors)] == []
    assert len(errors) == len(wrong), errors
    assert URL_PASSWORD not in done.stdout


def test_a_paused_run_sends_paused_with_the_command(tmp_path, receiver):
    rx = receiver()
    command = "ansible-playbook -i inventories/test site.yml -e rollout_continue=20261203T000000Z"
    paused = {"run_id": "20261203T000000Z", "after_batch": 1, "pause_after": "canary", "passed": ["h1"],
              "left": ["h2", "h3"], "releases": {}, "command": command}
    run_once(tmp_path, "paused", {"rollout_notify_url": url(rx)}, [record("h1", 0, "passed")], paused=paused)
    assert len(rx.bodies) == 1, rx.bodies
    message = json.loads(rx.bodies[0])
    assert message["verdict"] == "paused"
    assert command in message["summary"]
    no_secret_in(rx.bodies[0].decode())


def bake(verdict: str, action: str, no_traffic: str = "hold", reasons: list[str] | None = None) -> dict:
    """A host record's bake (roles/rollout filter rollout_bake_host), as tasks/bake.yml writes it."""
    return {"verdict": verdict, "batch_verdict": verdict, "action": action, "no_traffic": no_traffic,
            "window_s": 20, "outcome": verdict, "figures": {"requests": 3.0}, "reasons": reasons or []}


def test_a_run_held_by_an_inconclusive_bake_sends_bake_inconclusive(tmp_path, receiver):
    """Issue 28 item 1: rollout_bake_no_traffic=hold stops the run after the batch it could not judge;
    the message says "bake inconclusive", names the hosts and the command that continues."""
    rx = receiver()
    command = "ansible-playbook -i inventories/test site.yml -e rollout_continue=20261203T000000Z"
    paused = {"run_id": "20261203T000000Z", "after_batch": 1, "pause_after": "1", "passed": ["h1"],
              "left": ["h2", "h3"], "releases": {}, "command": command,
              "bake": {"no_traffic": "hold", "hosts": ["h1"], "msg": "bake inconclusive over 20 s"}}
    h1 = {**record("h1", 0, "passed"), "bake": bake("inconclusive", "hold")}
    run_dir, _ = run_once(tmp_path, "held", {"rollout_notify_url": url(rx)}, [h1], paused=paused)
    assert len(rx.bodies) == 1, rx.bodies
    message = json.loads(rx.bodies[0])
    assert message["verdict"] == "bake inconclusive"
    assert message["summary"].startswith("held after batch 1: bake inconclusive on h1 (rollout_bake_no_traffic=hold")
    assert command in message["summary"]
    assert message["hosts"]["passed"] == ["h1"]
    md = (run_dir / "rollout.md").read_text()
    assert "| h2 | held: not started |" in md


def test_a_host_rolled_back_by_its_bake_sends_rolled_back_with_the_bake_reason(tmp_path, receiver):
    rx = receiver()
    reason = "bake failed over 20 s: TTFT p95 1950.0 ms is 10.26x the other hosts' 190.0 ms"
    h2 = {**record("h2", 1, "rolled back", [reason]), "bake": bake("failed", "rollback", reasons=[reason[23:]])}
    run_once(tmp_path, "bake rolled back", {"rollout_notify_url": url(rx)}, [record("h1", 0, "passed"), h2])
    message = json.loads(rx.bodies[0])
    assert message["verdict"] == "rolled back"
    assert message["halting_host"] == "h2"
    assert message["halting_reason"] == reason
    assert message["summary"] == "halted: h2 failed and was rolled back; not reached: h3"


def test_a_bake_passed_by_the_setting_says_so_and_sends_passed(tmp_path, receiver):
    rx = receiver()
    h1 = {**record("h1", 0, "passed"), "bake": bake("inconclusive", "continue", "pass")}
    records = [h1, record("h2", 1, "passed"), record("h3", 2, "unchanged")]
    run_once(tmp_path, "bake passed by setting", {"rollout_notify_url": url(rx)}, records)
    message = json.loads(rx.bodies[0])
    assert message["verdict"] == "passed"
    assert message["summary"] == ("every host passed or was already validated; bake inconclusive on h1, passed by "
                                  "rollout_bake_no_traffic=pass")


@pytest.mark.parametrize(("extra", "wrong"), [
    ({"rollout_bake_s": 30, "rollout_prometheus_url": "http://127.0.0.1:9090"}, []),
    ({"rollout_bake_s": 30}, ["rollout_prometheus_url"]),
    ({"rollout_bake_s": -1}, ["rollout_bake_s"]),
    ({"rollout_bake_s": 30, "rollout_prometheus_url": "http://127.0.0.1:9090", "rollout_bake_no_traffic": "warm"},
     ["rollout_warm_set"]),
    ({"rollout_bake_s": 30, "rollout_prometheus_url": "http://127.0.0.1:9090",
      # Named twice: by the argument spec (its suboptions) and by the role's own check (open.yml's too).
      "rollout_bake_thresholds": {"max_ttft_p99_ratio": 2}}, ["rollout_bake_thresholds.max_ttft_p99_ratio"] * 2),
])
def test_preflights_argument_check_names_a_bad_bake_setting(tmp_path, extra, wrong):
    _, errors = _argument_check(tmp_path, extra)
    assert [name for name in wrong if not any(name in error for error in errors)] == []
    assert len(errors) == len(wrong), errors
