"""The sglang_service role's health wait, as plain functions: when it gives up, and what it shows.

- sglang_service_redact (filter): every secret the role knows, and any key SGLang prints after
  `--api-key` / `api_key=`, becomes `<redacted>`; the rest of the text stays as it was.
- sglang_service_health (module): the verdict that stops the wait early (unit failed, exited,
  crash-looping) and the one-line unit state of the failure message; one poll against a real local
  HTTP server and a unit that systemctl does not know.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "sglang_service"


def _load(name: str, path: Path):
    return load(path, name)


filters = _load("sglang_service_filters", ROLE / "filter_plugins" / "sglang_service.py")
health = _load("sglang_service_health", ROLE / "library" / "sglang_service_health.py")


# --- redaction -------------------------------------------------------------------------------------
def test_redact_replaces_every_known_secret():
    text = "start key=s3cret-global other=inst-key-1 again s3cret-global"
    assert filters.redact(text, ["s3cret-global", "inst-key-1"]) == (
        "start key=<redacted> other=<redacted> again <redacted>"
    )


def test_redact_longer_secret_first():
    # One key contains the other: the longer is replaced whole, not left half visible.
    assert filters.redact("k=abc123xyz", ["abc", "abc123xyz"]) == "k=<redacted>"


def test_redact_ignores_empty_and_missing_secrets():
    text = "nothing secret here, api_key=None"
    assert filters.redact(text, ["", None]) == text
    assert filters.redact(text, []) == text
    assert filters.redact(None, ["x"]) == ""


def test_redact_single_secret_string_and_lines():
    assert filters.redact(["a TOKEN b", "TOKEN"], "TOKEN") == ["a <redacted> b", "<redacted>"]


def test_redact_keys_sglang_prints_even_unknown_ones():
    line = (
        "server_args=ServerArgs(model_path='/srv/m', api_key='old-release-key', port=30004) "
        "argv: --port 30004 --api-key other-key --host 127.0.0.1 --api-key=third"
    )
    redacted = filters.redact(line, [])
    for key in ("old-release-key", "other-key", "third"):
        assert key not in redacted
    assert "api_key='<redacted>'" in redacted
    assert "--api-key <redacted> --host 127.0.0.1" in redacted
    assert "--api-key=<redacted>" in redacted
    assert "model_path='/srv/m'" in redacted


def test_redact_through_ansible_filter_name():
    assert filters.FilterModule().filters()["sglang_service_redact"]("x SECRET", ["SECRET"]) == "x <redacted>"


# --- the wait's verdict ----------------------------------------------------------------------------
RUNNING = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success",
           "NRestarts": "0", "ExecMainCode": "0", "ExecMainStatus": "0", "MainPID": "4242"}


def test_a_loading_unit_is_waited_for():
    assert health.verdict(RUNNING, 0) == ""
    assert health.verdict({**RUNNING, "ActiveState": "activating", "SubState": "start"}, 0) == ""


@pytest.mark.parametrize(
    ("change", "restarts_before", "reason"),
    [
        ({"ActiveState": "failed", "SubState": "failed", "Result": "exit-code"}, 0, "the unit failed"),
        ({"ActiveState": "activating", "SubState": "auto-restart"}, 0, "exited and systemd waits to restart it"),
        ({"NRestarts": "2"}, 1, "restarted its process 1 time(s) while we waited (crash loop)"),
        ({"ActiveState": "inactive", "SubState": "dead"}, 0, "not running"),
        ({"LoadState": "not-found"}, 0, "not loaded (LoadState=not-found)"),
    ],
)
def test_a_dead_or_crash_looping_unit_stops_the_wait(change, restarts_before, reason):
    assert reason in health.verdict({**RUNNING, **change}, restarts_before)


def test_earlier_restarts_do_not_count():
    # A unit that crashed last week (NRestarts 3 before the wait began) is waited for.
    assert health.verdict({**RUNNING, "NRestarts": "3"}, 3) == ""
    assert health.verdict({**RUNNING, "NRestarts": "3"}, -1) == ""


def test_summary_names_state_and_how_the_process_ended():
    failed = {**RUNNING, "ActiveState": "failed", "SubState": "failed", "Result": "exit-code",
              "ExecMainCode": "1", "ExecMainStatus": "1", "MainPID": "0"}
    assert health.summary(failed) == "ActiveState=failed SubState=failed Result=exit-code NRestarts=0 exit status 1"
    killed = {**failed, "Result": "signal", "ExecMainCode": "2", "ExecMainStatus": "9"}
    assert health.summary(killed).endswith("killed by signal 9")
    assert health.summary(RUNNING).endswith("MainPID=4242")


def test_parse_show():
    assert health.parse_show("ActiveState=failed\nSubState=failed\nExecStart={ path=/x ; argv[]=a=b }\n") == {
        "ActiveState": "failed", "SubState": "failed", "ExecStart": "{ path=/x ; argv[]=a=b }",
    }


# --- one poll, for real --------------------------------------------------------------------------------
class _Health(BaseHTTPRequestHandler):
    status = 503
    seen: ClassVar[list[str | None]] = []

    def do_GET(self):
        type(self).seen.append(self.headers.get("Authorization"))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Health.seen = []
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_get_status_sends_the_key_and_reads_the_status(server):
    url = f"http://127.0.0.1:{server.server_address[1]}/health_generate"
    _Health.status = 503
    assert health.get_status(url, "k1", 5) == (503, "HTTP 503 Service Unavailable")
    _Health.status = 200
    assert health.get_status(url, None, 5) == (200, "HTTP 200")
    assert _Health.seen == ["Bearer k1", None]


def test_get_status_nothing_listening():
    with __import__("socket").socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    status, said = health.get_status(f"http://127.0.0.1:{port}/health", None, 5)
    assert status == -1
    assert said.startswith("no answer")


FAILED_UNIT = """LoadState=loaded
ActiveState=activating
SubState=auto-restart
Result=exit-code
NRestarts=0
ExecMainCode=1
ExecMainStatus=1
MainPID=0
"""


def test_module_gives_up_on_a_crashed_unit(server, tmp_path):
    """The module run as Ansible runs it, with a systemctl that reports a unit between two crashes."""
    fake = tmp_path / "systemctl"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/calls\ncat <<'EOF'\n{FAILED_UNIT}EOF\n")
    fake.chmod(0o755)
    _Health.status = 503
    args = {"ANSIBLE_MODULE_ARGS": {"url": f"http://127.0.0.1:{server.server_address[1]}/health_generate",
                                    "unit": "sglang-main.service", "api_key": "the-secret-key",
                                    "restarts_before": 0}}
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    run = subprocess.run([sys.executable, str(ROLE / "library" / "sglang_service_health.py")],
                         input=json.dumps(args), capture_output=True, text=True, timeout=60, check=False, env=env)
    result = json.loads(run.stdout)
    assert result["healthy"] is False
    assert result["status"] == 503
    assert result["gave_up"] is True
    assert "SubState=auto-restart" in result["reason"]
    assert result["unit_summary"] == (
        "ActiveState=activating SubState=auto-restart Result=exit-code NRestarts=0 exit status 1"
    )
    assert "the-secret-key" not in run.stdout
    assert _Health.seen == ["Bearer the-secret-key"]
    assert (tmp_path / "calls").read_text().split()[-2:] == ["--", "sglang-main.service"]
