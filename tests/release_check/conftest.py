"""Fixtures of the release check's tests: real wheels (release_wheels.py), fetched and unpacked once."""

from __future__ import annotations

from pathlib import Path

import pytest
from release_wheels import CP312, fetch, unpack


@pytest.fixture(scope="session")
def rdna3_kernel() -> Path:
    """sgl_kernel/ of the gfx1100 kernel wheel (sglang-kernel-rdna3, cp312 only)."""
    return unpack(fetch("sglang-kernel-rdna3==0.4.6.post1", tuple(CP312)), ("sgl_kernel/",)) / "sgl_kernel"


@pytest.fixture(scope="session")
def torch_libs():
    """torch/lib/ with libc10.so and libtorch_cpu.so of a PyPI torch wheel (the same c10/torch_cpu
    exports as the ROCm builds; PyPI has no ROCm build), by version."""

    def get(version: str) -> Path:
        wheel = fetch(f"torch=={version}", tuple(CP312))
        return unpack(wheel, ("torch/lib/libc10.so", "torch/lib/libtorch_cpu.so")) / "torch" / "lib"

    return get


@pytest.fixture(scope="session")
def sglang_pkg():
    """sglang/ of a real sglang wheel, by version."""

    def get(version: str) -> Path:
        return unpack(fetch(f"sglang=={version}"), ("sglang/srt/",)) / "sglang"

    return get
