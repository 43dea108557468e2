"""Fixtures for the SGLang simulator tests: a fixture model directory and simulator processes.

Each server runs as a subprocess on 127.0.0.1 with a free port and is stopped by its PID in the
fixture's finalizer (SIGTERM, then SIGKILL), also when the test fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from simharness import SMALL_ENV, SMALL_HICACHE_ARGS, Sim, start_sim, wait_healthy


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    from sglang_sim.fixture_model import write_model_dir  # importable once simharness ran

    return write_model_dir(tmp_path_factory.mktemp("model") / "seed-27b")


@pytest.fixture(scope="session")
def sim_factory(tmp_path_factory, model_dir):
    started: list[Sim] = []
    logs = tmp_path_factory.mktemp("simlogs")

    def factory(extra_args=None, env=None, wait=True) -> Sim:
        sim = start_sim(logs, model_dir, extra_args, env, wait=False)
        started.append(sim)
        if wait:
            wait_healthy(sim)
        return sim

    yield factory
    for sim in started:
        sim.stop()


@pytest.fixture(scope="module")
def hicache_sim(sim_factory) -> Sim:
    sim = sim_factory(SMALL_HICACHE_ARGS, SMALL_ENV)
    return sim
