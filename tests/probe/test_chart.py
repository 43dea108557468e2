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


def test_chart_from_the_same_figures_is_not_drawn_again(tmp_path, monkeypatch):
    """The run report is rendered after every host and at the end of a run: a chart whose inputs did
    not change keeps its file (matplotlib, most of a render's cost, is not called), a change draws it."""
    path = tmp_path / "ttft.png"
    series = {"cold (cache flushed)": [192000.0], "warm (same prefix)": [3200.0]}
    report.ttft_chart(path, "t", ["host-1 (passed)"], series)
    first = path.read_bytes()
    assert report.png_text(path)[report.CHART_DIGEST_KEY] == report.chart_digest("t", ["host-1 (passed)"], series, None)
    drawn = []
    real_import = __import__

    def spy(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            drawn.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", spy)
    report.ttft_chart(path, "t", ["host-1 (passed)"], series)
    assert drawn == []
    assert path.read_bytes() == first
    # Another verdict in a label, another figure, another title: drawn again.
    report.ttft_chart(path, "t", ["host-1 (rolled back)"], series)
    assert drawn
    assert report.png_text(path)[report.CHART_DIGEST_KEY] != report.chart_digest(
        "t", ["host-1 (passed)"], series, None)
    drawn.clear()
    report.ttft_chart(path, "t", ["host-1 (rolled back)"], {**series, "warm (same prefix)": [3300.0]})
    assert drawn


def test_a_chart_without_its_digest_is_drawn_again(tmp_path):
    """A chart of an earlier version of the report (no digest), or a file cut short, is replaced."""
    path = tmp_path / "ttft.png"
    series = {"cold (cache flushed)": [1000.0], "warm (same prefix)": [100.0]}
    report.ttft_chart(path, "t", ["h"], series)
    whole = path.read_bytes()
    path.write_bytes(whole[:40])
    assert report.png_text(path) == {}
    report.ttft_chart(path, "t", ["h"], series)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.png_text(path)
    assert report.png_text(tmp_path / "missing.png") == {}
    # Cut short after its digest (tEXt comes before the image data): still drawn again.
    whole = path.read_bytes()
    assert report.CHART_DIGEST_KEY.encode() in whole[: whole.index(b"IDAT")]
    path.write_bytes(whole[: whole.index(b"IDAT") + 100])
    assert report.png_text(path) == {}
    report.ttft_chart(path, "t", ["h"], series)
    assert path.read_bytes() == whole
