"""The health poller (roles/sglang_service/library/sglang_service_health.py) against hostile servers
(issue 24): it runs as root outside the unit's firewall, with the instance's key. No redirect is
followed and the redirect target never sees the key; a key with a line break is refused naming its
variable; a server that drips its answer is cut off by the overall deadline."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "sglang_service"
health = load(ROLE / "library" / "sglang_service_health.py", "sglang_service_health_hostile")
fakes = load(ROOT / "tests" / "probe" / "hostile_fakes.py", "hostile_fakes_for_health")

KEY = "k3y-value-never-shown"
HANG_BOUND_S = 45.0


def test_a_redirect_is_refused_and_its_target_never_sees_the_key():
    with fakes.Recorder() as target, fakes.HostileServer("redirect", redirect_to=target.url) as srv:
        with pytest.raises(health.Refused) as err:
            health.get_status(f"{srv.url}/health_generate", KEY, 5)
        assert srv.seen == [("GET", "/health_generate", f"Bearer {KEY}")]
        assert target.seen == []
    assert err.value.status == 307
    assert "answered HTTP 307, a redirect" in err.value.reason
    assert "never followed" in err.value.reason


def test_a_health_path_that_makes_credentials_of_the_address_is_refused():
    """sglang_service_health_path `@127.0.0.1:<port>/` turns http://<bind>:<port> into credentials."""
    with fakes.Recorder() as target:
        url = f"http://127.0.0.1:30004@127.0.0.1:{target.port}/"
        with pytest.raises(health.Refused, match="sglang_service_health_path must be a path"):
            health.get_status(url, KEY, 5)
        assert target.seen == []


@pytest.mark.parametrize("bad", [KEY + "\n", " " + KEY, "k3y\rvalue"])
def test_a_key_with_a_line_break_is_refused_naming_the_variable(bad):
    with fakes.HostileServer() as srv:
        with pytest.raises(health.Refused) as err:
            health.get_status(f"{srv.url}/health", bad, 5)
        assert srv.seen == []
    assert "sglang_service_api_key" in err.value.reason
    assert "k3y" not in err.value.reason


def test_a_server_dripping_its_headers_is_cut_off_by_the_deadline():
    with fakes.HostileServer("drip_head") as srv:
        start = time.monotonic()
        status, said = health.get_status(f"{srv.url}/health_generate", None, 1)
        assert time.monotonic() - start < HANG_BOUND_S
    assert status == -1
    assert said == "no complete answer within 1 s"


def test_module_gives_up_on_a_key_with_a_newline_and_never_prints_it(tmp_path):
    fake = tmp_path / "systemctl"
    fake.write_text("#!/bin/sh\necho ActiveState=activating\necho SubState=start\n")
    fake.chmod(0o755)
    with fakes.HostileServer() as srv:
        args = {"ANSIBLE_MODULE_ARGS": {"url": f"{srv.url}/health_generate", "unit": "sglang-main.service",
                                        "api_key": KEY + "\n"}}
        run = subprocess.run([sys.executable, str(ROLE / "library" / "sglang_service_health.py")],
                             input=json.dumps(args), capture_output=True, text=True, timeout=60, check=False,
                             env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
        assert srv.seen == []
    result = json.loads(run.stdout)
    assert result["healthy"] is False
    assert result["gave_up"] is True
    assert "sglang_service_api_key" in result["reason"]
    assert "k3y-value" not in run.stdout + run.stderr
