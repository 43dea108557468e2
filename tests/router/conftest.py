"""Fixtures of the router tests: module_utils importable as Ansible names them, fake routers on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import ansible.module_utils
import pytest

REPO = Path(__file__).resolve().parents[2]

if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))

from router_fakes import FakeRouter  # noqa: E402


@pytest.fixture
def fake_router():
    fake = FakeRouter().start()
    yield fake
    fake.stop()


@pytest.fixture
def other_server():
    """A second fake on 127.0.0.1 a redirect points at: it must never be asked anything."""
    fake = FakeRouter().start()
    yield fake
    fake.stop()
