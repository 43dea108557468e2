"""The TTFT charts (roles/rollout/files/fleet_report.py) keep a warm bar readable next to a cold bar 60x longer."""

from __future__ import annotations

import pytest
from plugins import load

report = load("roles/rollout/files/fleet_report.py", "fleet_report")


def test_close_bars_keep_a_linear_axis():
    assert report.chart_axis([1000.0, 400.0]) == ("linear", 0.0, 1.25)


def test_a_cold_bar_60_times_longer_gets_a_log_axis_both_bars_visible():
    scale, left, right = report.chart_axis([192000.0, 3200.0, None])
    assert scale == "log"
    # the warm bar (3.2 s) starts at most half its length in, the cold one fits with its label
    assert left <= 3.2 / 2
    assert right > 192.0


@pytest.mark.parametrize("values", [[], [None], [0.0, 0.0]])
def test_no_figures_still_give_an_axis(values):
    scale, left, right = report.chart_axis(values)
    assert scale == "linear"
    assert right > left


def test_chart_renders_with_a_log_axis(tmp_path):
    path = tmp_path / "ttft.png"
    report.ttft_chart(path, "t", ["host-1"], {"cold (cache flushed)": [192000.0], "warm (same prefix)": [3200.0]})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
