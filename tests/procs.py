"""Process helpers shared by the test suites: whatever a test starts, it stops by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


def stop_by_pid(proc: subprocess.Popen, grace_s: float = 10.0) -> int | None:
    """SIGTERM the process by its PID, SIGKILL it if it outlives the grace period; its exit code."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace_s)
    return proc.returncode


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
