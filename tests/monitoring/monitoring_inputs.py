"""The monitoring tests' inputs (a module of its own, so that test files import it by a unique name,
whatever other conftest.py a run has loaded): the test inventory's hosts, their validation record,
and promtool."""

from __future__ import annotations

import shutil

import pytest

# Three SGLang hosts; h1 and h3 carry a validation record (cold 1.0 s, warm 0.02 s), h2 none.
HOSTS = {"h1": "127.0.22.1", "h2": "127.0.22.2", "h3": "127.0.22.3"}
RECORD = {
    "instances": {"main": {"instance": "main", "config_hash": "abcdef0123456789", "probe": {
        "input_len": 64000, "cold": {"median_ttft_ms": 1000.0},
        "warm": {"host": {"median_ttft_ms": 20.0}}, "gate": {"passed": True}}}},
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: scripts/host-tools.sh installs it (Debian's prometheus package)")
    return path
