"""The free-disk check (library/fleet_free_disk.py, module_utils/fleet_free_disk.py): the one
implementation the preflight and models roles call. Its summing rules are tested in
tests/preflight/test_preflight_host_checks.py; here: what it reads off a real filesystem, and the
module run by Ansible, returning the findings or failing with them (fail_msg)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from plugins import adhoc_module, load

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
disk = load(REPO / "module_utils" / "fleet_free_disk.py")


def test_a_path_not_there_yet_is_measured_on_its_nearest_parent(tmp_path):
    missing = tmp_path / "a" / "b" / "c"
    assert disk.nearest_existing(str(missing)) == str(tmp_path)
    measured = disk.measure(str(missing))
    stat = os.statvfs(tmp_path)
    # The same filesystem as df would show for tmp_path (free space moves a little between two reads).
    assert abs(measured["free"] - stat.f_bavail * stat.f_frsize) < 512 * 1024 * 1024
    assert os.path.ismount(measured["mount"])
    assert str(tmp_path.resolve()).startswith(measured["mount"].rstrip("/") + "/")


def test_a_dangling_link_is_measured_on_its_parent(tmp_path):
    (tmp_path / "models").symlink_to(tmp_path / "nowhere")
    assert disk.nearest_existing(str(tmp_path / "models" / "main")) == str(tmp_path)
    assert disk.measure(str(tmp_path / "models"))["free"] > 0


def test_check_measures_each_path_once_and_sums_per_filesystem():
    calls = []

    def fake(path):
        calls.append(path)
        return {"free": 10_000_000_000, "mount": "/"}

    needs = [{"path": "/opt", "need_bytes": 6e9, "what": "a", "fix": "F."},
             {"path": "/opt", "need_bytes": 6e9, "what": "b", "fix": "F."},
             {"path": "/srv", "need_bytes": 0, "what": "skipped stage", "fix": "F."}]
    result = disk.check(needs, "h", measure_fn=fake)
    assert calls == ["/opt"]
    (finding,) = result["findings"]
    assert finding.startswith("the filesystem at / on h has 10.0 GB free, but this run stages 12.0 GB there")
    assert result["filesystems"] == {"/": 10_000_000_000}


def test_malformed_needs_are_named():
    errors = disk.validate_needs([{"path": "rel", "need_bytes": "x", "what": "w", "fix": "f"}, {"path": "/a"}, 3])
    assert errors == ["needs[1].need_bytes = 'x' is not a number", "needs[1].path = 'rel' is not absolute",
                      "needs[2] lacks need_bytes, what, fix", "needs[3] is not a mapping"]


def _adhoc(tmp_path: Path, args: dict) -> tuple[int, dict]:
    return adhoc_module(tmp_path, "fleet_free_disk", args)


@pytest.mark.parametrize("fail_msg", [None, "not enough free disk on localhost; nothing was fetched"])
def test_the_module_finds_a_need_larger_than_the_filesystem(tmp_path, fail_msg):
    free = disk.measure(str(tmp_path))["free"]
    needs = [{"path": str(tmp_path / "new" / "model"), "need_bytes": free + 10**15, "what": "the model",
              "fix": "Change models_dir."},
             {"path": str(tmp_path), "need_bytes": 1, "what": "a byte", "fix": "Nothing."}]
    args = {"needs": needs, "host": "localhost", **({"fail_msg": fail_msg} if fail_msg else {})}
    rc, result = _adhoc(tmp_path, args)
    (finding,) = result["findings"]
    assert "on localhost has" in finding, finding
    assert "but this run stages" in finding, finding
    assert "the model under " + str(tmp_path / "new" / "model") in finding
    assert "Change models_dir. Nothing." in finding
    if fail_msg:
        assert rc == 2
        assert result["failed"] is True
        assert result["msg"].splitlines()[0] == fail_msg + ":"
        assert result["msg"].splitlines()[1].startswith("  1. the filesystem at ")
    else:
        assert rc == 0
        assert not result.get("failed")
        assert result["changed"] is False


def test_the_module_passes_what_fits_and_refuses_a_relative_path(tmp_path):
    rc, result = _adhoc(tmp_path, {"needs": [{"path": str(tmp_path), "need_bytes": 1, "what": "w", "fix": "f"}],
                                   "host": "localhost", "fail_msg": "short"})
    assert rc == 0, result
    assert result["findings"] == [], result
    rc, result = _adhoc(tmp_path, {"needs": [{"path": "srv", "need_bytes": 1, "what": "w", "fix": "f"}],
                                   "host": "localhost"})
    assert rc == 2, result
    assert result["msg"] == "invalid needs: needs[1].path = 'srv' is not absolute", result
