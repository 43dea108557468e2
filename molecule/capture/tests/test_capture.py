"""Verify the capture rolled out: both hosts serve from a release unpacked from the capture of
capture-1, every file the manifest lists is there bit for bit (the same sha256 on capture-2, on
capture-3 and in the manifest), the release passed its checks (import, venv check, release check)
and the gate (the rollout report), and the reference host's own venv was only read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import testinfra.utils.ansible_runner

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("sglang_hosts")

EPHEMERAL = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY") or Path(inventory).resolve().parents[1])
STORE = EPHEMERAL / "captures" / "reference"


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((STORE / "manifest.json").read_text())


def release_of(host) -> str:
    """The venv release the running server was started from (its unit names the release by its own
    path, so a switch of `current` never changes what runs underneath it)."""
    pid = host.check_output("systemctl show -p MainPID --value sglang-main.service")
    assert pid != "0", "sglang-main.service is not running"
    python = host.file(f"/proc/{pid}/cmdline").content_string.split("\x00")[0]
    assert python.endswith("/bin/python"), python
    return os.path.dirname(os.path.dirname(python))


def test_current_is_the_capture(host, manifest):
    release = release_of(host)
    name = os.path.basename(release)
    assert name.startswith(f"{manifest['sglang_version']}-capture-reference-"), name
    assert host.file(f"{release}/.hicache-fleet-capture.json").content_string.strip().startswith("{")
    assert host.file(f"{release}/.hicache-fleet-packages.sha256").exists  # passed the release's checks
    assert host.file(f"{release}/pyvenv.cfg").exists
    # The copied archive was removed once unpacked.
    assert host.check_output("ls /opt/sglang/captures 2>/dev/null | wc -l") == "0"


def test_every_listed_file_bit_for_bit(host, manifest):
    release = release_of(host)
    listed = {p: e["sha256"] for p, e in manifest["files"].items() if "sha256" in e}
    # sha256 of every regular file of the release (it may hold more: the toolkit's markers).
    out = host.check_output(f"cd {release} && find . -type f -print0 | xargs -0 sha256sum")
    on_host = {line[66:].removeprefix("./"): line[:64] for line in out.splitlines()}
    assert len(listed) > 1000
    assert {p: on_host.get(p) for p in listed} == listed
    links = {p: e["link"] for p, e in manifest["files"].items() if "link" in e}
    for path, target in links.items():
        assert host.check_output(f"readlink {release}/{path}") == target, path


def test_the_service_runs_the_capture(host):
    release = release_of(host)
    assert release.startswith("/opt/sglang/venvs/")
    unit = host.file("/etc/systemd/system/sglang-main.service").content_string
    assert f"ExecStart={release}/bin/python -m sglang_sim.launch_server" in unit
    assert host.service("sglang-main.service").is_running


def test_the_gate_passed_for_both_hosts():
    reports = sorted((EPHEMERAL / "reports").glob("*/rollout.json"))
    assert reports, "no rollout report"
    first = json.loads(reports[0].read_text())
    verdicts = {h["host"]: h["verdict"] for h in first["hosts"]}
    assert verdicts == {"capture-2": "passed", "capture-3": "passed"}
