"""Index credentials reach pip in a netrc file, never on its command line: the sglang_venv role, run
for real on localhost (every phase of `main`) into a root under tmp, installs a small package set from
two local indexes on 127.0.0.0/8 that answer only with HTTP basic auth (tests/venv/basic_auth_index.py,
each with its own account; one password percent-encoded in its URL, `%40` for `@`).

While it runs, a watcher reads every process's /proc/<pid>/cmdline and environ: no process (pip, the
module, its shell) ever holds a password. Afterwards: the install went through the indexes with the
credentials (their logs), -vvv --diff printed no password, no file the role left readable by others holds one,
no netrc directory is left in /tmp, and a second run changes nothing. Check mode with --diff prints no
password either, and a wrong password fails the install naming the index URL without credentials, its
netrc file removed all the same.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cred_index import Watcher, start_index, wheel
from procs import stop_by_pid

ROOT = Path(__file__).resolve().parents[2]
PASSWORD_A = "p@ss-Idx-7Qw"  # noqa: S105 (a test password; its URL says p%40ss-Idx-7Qw)
PASSWORD_B = "pw-Extra-3Zr"  # noqa: S105
SECRETS = (PASSWORD_A, "p%40ss-Idx-7Qw", PASSWORD_B, base64.b64encode(f"bob:{PASSWORD_A}".encode()).decode(),
           base64.b64encode(f"carol:{PASSWORD_B}".encode()).decode())
NETRC_DIRS = "hicache-fleet-pip-auth.*"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the role writes root-owned files (owner root)")

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - sglang_venv
"""


@pytest.fixture(scope="module")
def indexes():
    """Two basic-auth indexes, on 127.0.0.61 (bob, the fake sglang) and 127.0.0.62 (carol, an extra)."""
    work = Path(tempfile.mkdtemp(prefix="venv-cred-index-"))
    procs, urls = [], {}
    try:
        for address, user, password, name, module, source in (
            ("127.0.0.61", "bob", PASSWORD_A, "sglang", "sglang", '__version__ = "0.0.1"\n'),
            ("127.0.0.62", "carol", PASSWORD_B, "hfcred-extra", "hfcred_extra", "VALUE = 1\n"),
        ):
            wheels = work / address
            wheels.mkdir()
            wheel(wheels, name, "0.0.1", module, source)
            log = work / f"{address}.log"
            proc, port = start_index(address, user, password, wheels, log)
            procs.append(proc)
            # The index as pip's argv must name it: the test server's own address, no credentials.
            urls[address] = {"port": port, "log": log, "public": f"http://{address}:{port}/idx/"}
        yield urls
    finally:
        for proc in procs:
            stop_by_pid(proc)
        subprocess.run(["rm", "-rf", str(work)], check=False)


def role_vars(root: Path, indexes: dict, password_a: str = "p%40ss-Idx-7Qw") -> dict:  # noqa: S107 (a test password)
    port_a, port_b = indexes["127.0.0.61"]["port"], indexes["127.0.0.62"]["port"]
    return {
        "ansible_python_interpreter": sys.executable,
        "sglang_venv_root": str(root),
        "sglang_venv_python_interpreter": "/usr/bin/python3",
        "sglang_venv_manage_os_packages": False,
        "sglang_venv_package_set": "cred-test",
        "sglang_venv_sglang_version": "0.0.1",
        "sglang_venv_index_url": f"http://bob:{password_a}@127.0.0.61:{port_a}/idx/",
        "sglang_venv_package_sets": {"cred-test": {
            "steps": [
                {"name": "sglang from the first index", "packages": ["sglang==0.0.1"], "no_deps": True},
                {"name": "an extra from the second index", "packages": ["hfcred-extra==0.0.1"], "no_deps": True,
                 "extra_index_url": f"http://carol:{PASSWORD_B}@127.0.0.62:{port_b}/idx/"},
            ],
            "verify_imports": ["hfcred_extra"],
            "check": {"torch_build": "any"},
        }},
    }


def play(work: Path, variables: dict, *args: str) -> subprocess.CompletedProcess:
    (work / "play.yml").write_text(PLAYBOOK)
    (work / "vars.json").write_text(json.dumps(variables))  # -e @file: the password on no command line
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_FACT_CACHING="memory", ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_NOCOLOR="1",
               PIP_CONFIG_FILE=os.devnull)  # this machine's pip.conf names no index of the test's
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-vvv", "-i", "localhost,", str(work / "play.yml"),
         "-e", f"@{work / 'vars.json'}", *args],
        env=env, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    )


def changed(run: subprocess.CompletedProcess) -> int:
    return int(re.search(r"localhost\s*:.*changed=(\d+)", run.stdout).group(1))


def printed(output: str) -> list[str]:
    return [line for line in output.splitlines() if any(secret in line for secret in SECRETS)]


def readable_by_others_holding_a_secret(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_symlink() or not path.is_file() or not path.stat().st_mode & 0o004:
            continue
        data = path.read_bytes()
        if any(secret.encode() in data for secret in SECRETS):
            found.append(str(path))
    return found


def netrc_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob(NETRC_DIRS))


def test_the_install_gets_the_credentials_from_a_netrc_file_and_never_on_a_command_line(indexes, tmp_path):
    root = tmp_path / "opt-sglang"
    before = netrc_dirs()
    watcher = Watcher(SECRETS)
    watcher.start()
    try:
        first = play(tmp_path, role_vars(root, indexes), "--diff")
    finally:
        watcher.stop.set()
        watcher.join()
    output = first.stdout + first.stderr
    assert first.returncode == 0, output[-5000:]
    # pip ran, and went through both indexes with their credentials.
    assert watcher.pips > 0
    for address, wheel_name in (("127.0.0.61", "sglang-0.0.1"), ("127.0.0.62", "hfcred_extra-0.0.1")):
        log = indexes[address]["log"].read_text()
        assert f"200 /files/{wheel_name}-py3-none-any.whl" in log, log
    # No process held a password; -vvv printed none; pip's argv names the indexes without them.
    assert watcher.seen == []
    assert printed(output) == []
    assert indexes["127.0.0.61"]["public"] in output
    assert "--extra-index-url=" + indexes["127.0.0.62"]["public"] in output
    # The release is complete and current; no file left readable by others holds a password, and
    # the netrc file's directory is gone.
    release = (root / "current").resolve()
    assert (release / ".hicache-fleet-packages.sha256").is_file()
    assert subprocess.run([str(release / "bin/python"), "-c", "import sglang, hfcred_extra"],
                          check=False).returncode == 0
    assert readable_by_others_holding_a_secret(root) == []
    assert netrc_dirs() - before == set()

    # A second run changes nothing (nothing to install: no netrc file either).
    second = play(tmp_path, role_vars(root, indexes))
    assert second.returncode == 0, second.stdout[-3000:]
    assert changed(second) == 0
    assert printed(second.stdout + second.stderr) == []


def test_check_mode_and_diff_print_no_password(indexes, tmp_path):
    run = play(tmp_path, role_vars(tmp_path / "fresh", indexes), "--check", "--diff")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "Would build release 0.0.1-cred-test-" in run.stdout
    assert printed(run.stdout + run.stderr) == []
    assert not (tmp_path / "fresh").exists()


def test_a_wrong_password_fails_the_install_without_printing_it(indexes, tmp_path):
    before = netrc_dirs()
    run = play(tmp_path, role_vars(tmp_path / "wrong", indexes, password_a="Wrong%2Dpw-9Xk"))  # noqa: S106
    output = run.stdout + run.stderr
    assert run.returncode != 0
    assert "Install each step of the package set" in output
    assert "Wrong-pw-9Xk" not in output
    assert "Wrong%2Dpw-9Xk" not in output
    assert printed(output) == []
    assert "401" in indexes["127.0.0.61"]["log"].read_text()
    assert netrc_dirs() - before == set()


def test_the_wheelhouse_playbook_downloads_with_the_credentials_from_a_netrc_file(indexes, tmp_path):
    """playbooks/wheelhouse.yml on the controller: pip download gets the credentials the same way; no
    process held a password, -vvv printed none, wheelhouse.json names the indexes without them."""
    out = tmp_path / "wheelhouse"
    variables = {**role_vars(tmp_path / "unused", indexes), "sglang_venv_wheelhouse_set": "cred-test",
                 "sglang_venv_wheelhouse_out": str(out), "sglang_venv_wheelhouse_python_version": "3.11"}
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FACT_CACHING="memory", ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_NOCOLOR="1",
               PIP_CONFIG_FILE=os.devnull)
    before = netrc_dirs()
    watcher = Watcher(SECRETS)
    watcher.start()
    try:
        run = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-vvv", str(ROOT / "playbooks/wheelhouse.yml"),
             "-e", f"@{tmp_path / 'vars.json'}"],
            env=env, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)
    finally:
        watcher.stop.set()
        watcher.join()
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    assert sorted(p.name for p in out.glob("*.whl")) == ["hfcred_extra-0.0.1-py3-none-any.whl",
                                                         "sglang-0.0.1-py3-none-any.whl"]
    assert watcher.seen == []
    assert printed(run.stdout + run.stderr) == []
    record = (out / "wheelhouse.json").read_text()
    assert indexes["127.0.0.61"]["public"] in record
    assert not [secret for secret in SECRETS if secret in record]
    assert readable_by_others_holding_a_secret(out) == []
    assert netrc_dirs() - before == set()
