"""Helpers of the index-credential tests (test_index_credentials.py, test_locks.py): a wheel built in
place, a basic-auth index on 127.0.0.0/8 started with its account on stdin (basic_auth_index.py),
and a watcher of every process's command line and environment."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

SERVER = Path(__file__).with_name("basic_auth_index.py")


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
    """Reads every process's cmdline and environ until stopped; keeps what held one of `secrets`."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.secrets = secrets
        self.stop = threading.Event()
        self.seen: list[str] = []
        self.pips = 0

    def run(self) -> None:
        needles = [secret.encode() for secret in self.secrets]
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


def start_index(address: str, user: str, password: str, wheels: Path, log: Path) -> tuple[subprocess.Popen, int]:
    """basic_auth_index.py on `address` serving `wheels`: the process (the caller stops it by its PID)
    and its port. The account goes on stdin, on no command line."""
    proc = subprocess.Popen([sys.executable, str(SERVER), address, str(wheels), str(log)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdin.write(f"{user}\n{password}\n")
    proc.stdin.close()
    return proc, int(proc.stdout.readline())
