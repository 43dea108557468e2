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
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

import pytest
from procs import stop_by_pid

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("basic_auth_index.py")
PASSWORD_A = "p@ss-Idx-7Qw"  # noqa: S105 (a test password; its URL says p%40ss-Idx-7Qw)
PASSWORD_B = "pw-Extra-3Zr"  # noqa: S105
SECRETS = (PASSWORD_A, "p%40ss-Idx-7Qw", PASSWORD_B,
           base64.b64encode(f"bob:{PASSWORD_A}".encode()).decode(), base64.b64encode(f"carol:{PASSWORD_B}".encode()).decode())
NETRC_DIRS = "hicache-fleet-pip-auth.*"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the role writes root-owned files (owner root)")

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - sglang_venv
"""


def wheel(directory: Path, name: str, version: str, module: str, source: str) -> None:
    """A pure-Python wheel of one module, with its metadata and RECORD."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{module}/__init__.py": source.encode(),
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(directory / f"{dist}-py3-none-any.whl", "w") as archive:
        for path, data in [*files.items(), (f"{dist}.dist-info/RECORD", record.encode())]:
            archive.writestr(path, data)


class Watcher(threading.Thread):
    """Reads every process's cmdline and environ until stopped; keeps what held a secret."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.seen: list[str] = []
        self.pips = 0

    def run(self) -> None:
        needles = [secret.encode() for secret in SECRETS]
        while not self.stop.is_set():
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit() or proc.name == str(os.getpid()):
                    continue
                for part in ("cmdline", "environ"):
                    try:
                        data = (proc / part).read_bytes()
                    except OSError:
                        continue
                    if part == "cmdline" and b"pip\x00install" in data:
                        self.pips += 1
                    if any(needle in data for needle in needles):
                        # What held it, not the secret: the process's first words.
                        words = (proc / "cmdline").read_bytes().split(b"\x00")[:4] if part == "environ" else \
                            data.split(b"\x00")[:4]
                        self.seen.append(f"{proc.name}/{part}: {b' '.join(words)[:120]!r}")
            self.stop.wait(0.02)


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
            proc = subprocess.Popen([sys.executable, str(SERVER), address, str(wheels), str(log)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs.append(proc)
            proc.stdin.write(f"{user}\n{password}\n")
            proc.stdin.close()
            urls[address] = {"port": int(proc.stdout.readline()), "log": log}
        yield urls
    finally:
        for proc in procs:
            stop_by_pid(proc)
        subprocess.run(["rm", "-rf", str(work)], check=False)


def role_vars(root: Path, indexes: dict, password_a: str = "p%40ss-Idx-7Qw") -> dict:
    port_a, port_b = indexes["127.0.0.61"]["port"], indexes["127.0.0.62"]["port"]
    return {
        "ansible_python_interpreter": sys.executable,
        "sglang_venv_root": str(root),
        "sglang_venv_python_interpreter": "/usr/bin/python3",
        "sglang_venv_manage_os_packages": False,
        "sglang_venv_package_set": "cred-test",
        "sglang_venv_sglang_version": "0.0.1",
        "sglang_venv_index_url": f"http://bob:{password_a}@127.0.0.61:{port_a}/simple/",
        "sglang_venv_package_sets": {"cred-test": {
            "steps": [
                {"name": "sglang from the first index", "packages": ["sglang==0.0.1"], "no_deps": True},
                {"name": "an extra from the second index", "packages": ["hfcred-extra==0.0.1"], "no_deps": True,
                 "extra_index_url": f"http://carol:{PASSWORD_B}@127.0.0.62:{port_b}/simple/"},
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
               ANSIBLE_FACT_CACHING="memory", ANSIBLE_NOCOLOR="1",
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
    watcher = Watcher()
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
    assert f"http://127.0.0.61:{indexes['127.0.0.61']['port']}/simple/" in output
    assert f"--extra-index-url=http://127.0.0.62:{indexes['127.0.0.62']['port']}/simple/" in output
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
    run = play(tmp_path, role_vars(tmp_path / "wrong", indexes, password_a="Wrong%2Dpw-9Xk"))
    output = run.stdout + run.stderr
    assert run.returncode != 0
    assert "Install each step of the package set" in output
    assert "Wrong-pw-9Xk" not in output
    assert "Wrong%2Dpw-9Xk" not in output
    assert printed(output) == []
    assert "401" in indexes["127.0.0.61"]["log"].read_text()
    assert netrc_dirs() - before == set()
