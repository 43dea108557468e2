"""Prune as one module call (library/sglang_service_release.py, state prune): the rules of
module_utils/sglang_service_release.py on a tmp dir.

- releases beyond sglang_service_releases_keep go (oldest first by mtime), never the `current` or
  `previous` one nor a protected id; their JIT caches go with them (and caches whose release was never
  there), a kept release's stays;
- the L3 identity directories of the release `current` names and of the plan stay, every other goes;
- the kept releases' release.json come back parsed (an unreadable one left out; one that is not JSON
  stops prune before anything is removed);
- check mode removes nothing and says what would go (and --diff lists it);
- a symlink is never followed: one in place of a release, a cache or an L3 directory is neither listed
  nor removed (its target intact), one put there after the listing is refused, a releases directory
  that is one refuses the prune.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from plugins import load

R = load("module_utils/sglang_service_release.py")
F = load("roles/sglang_service/filter_plugins/sglang_service.py")

IDS = [f"{i:012x}" for i in range(6)]  # oldest first


def _host(tmp_path: Path, l3: bool = True) -> dict:
    """One instance `main` with six releases (IDS, oldest first), a cache per release plus an orphan,
    and an L3 directory per release plus the plan's."""
    state, l3_dir = tmp_path / "state", tmp_path / "l3"
    inst = {"name": "main", "state_dir": str(state / "main"), "releases_dir": str(state / "main" / "releases"),
            "cache_root": str(state / "main" / "cache"),
            "l3": {"dir": str(l3_dir / "main" / "planned000000000"), "id": "planned000000000"} if l3 else {}}
    now = time.time()
    for age, rid in enumerate(IDS):
        release = Path(inst["releases_dir"]) / rid
        release.mkdir(parents=True)
        record = {"name": "main", "config_hash": rid + "0" * 52, "release_dir": str(release),
                  "venv": f"/opt/venvs/{rid}", "l3": {"dir": str(l3_dir / "main" / (rid + "0000"))}}
        (release / "release.json").write_text(json.dumps(record), encoding="utf-8")
        (Path(inst["cache_root"]) / rid / "triton").mkdir(parents=True)
        (l3_dir / "main" / (rid + "0000")).mkdir(parents=True)
        (l3_dir / "main" / (rid + "0000") / "page.bin").write_bytes(b"kv")
        os.utime(release, (now - 1000 * (len(IDS) - age),) * 2)
    (Path(inst["cache_root"]) / "orphan000000").mkdir()
    (l3_dir / "main" / "planned000000000").mkdir()
    return {"instances": [inst], "l3_dir": str(l3_dir), "tmp": tmp_path}


def _point(host: dict, which: str, rid: str) -> None:
    inst = host["instances"][0]
    os.symlink(os.path.join(inst["releases_dir"], rid), os.path.join(inst["state_dir"], which))


def _left(path: str | Path) -> list[str]:
    return sorted(p.name for p in Path(path).iterdir())


def _prune(host: dict, keep: int = 2, protect=(), check_mode: bool = False, want_diff: bool = False) -> dict:
    return R.prune(host["instances"], keep, list(protect), host["l3_dir"], check_mode, want_diff)


def test_keeps_the_newest_current_previous_and_protected_and_their_caches(tmp_path):
    host = _host(tmp_path)
    _point(host, "current", IDS[0])
    _point(host, "previous", IDS[1])
    result = _prune(host, keep=2, protect=[IDS[2] + "f" * 52])  # a full config hash protects its release
    inst = host["instances"][0]
    assert _left(inst["releases_dir"]) == [IDS[0], IDS[1], IDS[2], IDS[4], IDS[5]]
    assert _left(inst["cache_root"]) == [IDS[0], IDS[1], IDS[2], IDS[4], IDS[5]]  # the orphan went too
    assert result["changed"] is True
    assert sorted(result["removed"]) == sorted([
        f"{inst['releases_dir']}/{IDS[3]}", f"{inst['cache_root']}/{IDS[3]}", f"{inst['cache_root']}/orphan000000",
        *(f"{host['l3_dir']}/main/{rid}0000" for rid in IDS[1:])])
    assert result["refused"] == []


def test_keep_counts_by_mtime_not_by_name(tmp_path):
    host = _host(tmp_path, l3=False)
    inst = host["instances"][0]
    os.utime(Path(inst["releases_dir"]) / IDS[0], (time.time(),) * 2)  # the first by name is the newest now
    _prune(host, keep=1)
    assert _left(inst["releases_dir"]) == [IDS[0]]


def test_l3_stays_for_the_running_release_and_the_plan_only(tmp_path):
    host = _host(tmp_path)
    _point(host, "current", IDS[3])
    _point(host, "previous", IDS[4])
    _prune(host, keep=6)  # every release kept: only the L3 rule decides
    assert _left(Path(host["l3_dir"]) / "main") == [IDS[3] + "0000", "planned000000000"]
    assert (Path(host["l3_dir"]) / "main" / (IDS[3] + "0000") / "page.bin").read_bytes() == b"kv"


def test_nothing_running_keeps_only_the_planned_l3_and_tier_off_keeps_none(tmp_path):
    host = _host(tmp_path)
    _prune(host, keep=6)
    assert _left(Path(host["l3_dir"]) / "main") == ["planned000000000"]
    off = _host(tmp_path / "off", l3=False)
    _prune(off, keep=6)
    assert _left(Path(off["l3_dir"]) / "main") == []


def test_kept_releases_are_the_parsed_release_json_of_each_kept_release(tmp_path):
    host = _host(tmp_path)
    inst = host["instances"][0]
    _point(host, "current", IDS[0])
    (Path(inst["releases_dir"]) / IDS[5] / "release.json").unlink()  # unreadable: left out, as slurp's failure was
    kept = _prune(host, keep=2)["kept_releases"]
    assert [r["config_hash"][:12] for r in kept] == [IDS[0], IDS[4]]
    assert kept[0] == json.loads((Path(inst["releases_dir"]) / IDS[0] / "release.json").read_text())


def test_a_release_json_that_is_not_json_stops_prune_before_anything_goes(tmp_path):
    host = _host(tmp_path)
    inst = host["instances"][0]
    (Path(inst["releases_dir"]) / IDS[5] / "release.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"release\.json is not JSON"):
        _prune(host, keep=1)
    assert _left(inst["releases_dir"]) == IDS


def test_check_mode_removes_nothing_and_says_what_would_go(tmp_path):
    host = _host(tmp_path)
    _point(host, "current", IDS[0])
    inst = host["instances"][0]
    before = {p: _left(p) for p in (inst["releases_dir"], inst["cache_root"], Path(host["l3_dir"]) / "main")}
    dry = _prune(host, keep=2, check_mode=True, want_diff=True)
    assert {p: _left(p) for p in before} == before
    assert dry["changed"] is True
    real = _prune(host, keep=2, want_diff=True)
    assert sorted(dry["removed"]) == sorted(real["removed"])
    assert dry["kept_releases"] == real["kept_releases"]
    gone = {line for line in dry["diff"]["before"].splitlines()} - set(dry["diff"]["after"].splitlines())
    assert gone == set(dry["removed"])
    assert f"{inst['releases_dir']}/{IDS[0]}\n" in dry["diff"]["after"]
    # Nothing left to prune: no change.
    assert _prune(host, keep=2)["changed"] is False


def test_a_symlink_where_a_release_cache_or_l3_directory_was_is_not_followed(tmp_path):
    host = _host(tmp_path)
    inst = host["instances"][0]
    outside = tmp_path / "outside"
    (outside / "precious").mkdir(parents=True)
    (outside / "precious" / "data").write_text("keep me")
    planted = [Path(inst["releases_dir"]) / "aaaaaaaaaaaa", Path(inst["cache_root"]) / "bbbbbbbbbbbb",
               Path(host["l3_dir"]) / "main" / "cccccccccccccccc"]
    for link in planted:
        link.symlink_to(outside)
        os.utime(link, (0, 0), follow_symlinks=False)  # the oldest entry there
    result = _prune(host, keep=1)
    assert all(link.is_symlink() for link in planted)
    assert (outside / "precious" / "data").read_text() == "keep me"
    assert not any(str(link) in result["removed"] for link in planted)
    assert result["refused"] == []  # never listed, so never even tried


def test_a_directory_swapped_for_a_symlink_after_the_listing_is_refused(tmp_path, monkeypatch):
    host = _host(tmp_path, l3=False)
    inst = host["instances"][0]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data").write_text("keep me")
    victim = Path(inst["releases_dir"]) / IDS[0]
    plan = R.prune_plan

    def swapped(*args):
        found = plan(*args)
        os.rename(victim, tmp_path / "moved")
        victim.symlink_to(outside)
        return found

    monkeypatch.setattr(R, "prune_plan", swapped)
    result = _prune(host, keep=5)
    assert result["refused"] == [str(victim)]
    assert victim.is_symlink()
    assert (outside / "data").read_text() == "keep me"


def test_a_releases_directory_that_is_a_symlink_refuses_the_prune(tmp_path):
    host = _host(tmp_path)
    inst = host["instances"][0]
    real = tmp_path / "elsewhere"
    os.rename(inst["releases_dir"], real)
    os.symlink(real, inst["releases_dir"])
    with pytest.raises(R.PruneRefused, match="is a symlink"):
        _prune(host, keep=1)
    assert _left(real) == IDS
    assert _left(inst["cache_root"]) == sorted([*IDS, "orphan000000"])


def test_the_current_release_stays_when_the_state_directory_is_reached_through_a_symlink(tmp_path):
    host = _host(tmp_path)
    link = tmp_path / "via"
    link.symlink_to(tmp_path / "state")
    inst = host["instances"][0]
    inst.update({key: inst[key].replace(str(tmp_path / "state"), str(link))
                 for key in ("state_dir", "releases_dir", "cache_root")})
    _point(host, "current", IDS[0])  # activate writes the pointer with the configured (unresolved) path
    _prune(host, keep=1)
    assert _left(inst["releases_dir"]) == [IDS[0], IDS[5]]
    assert _left(Path(host["l3_dir"]) / "main") == [IDS[0] + "0000", "planned000000000"]


def test_a_state_directory_written_with_a_trailing_slash_prunes_the_same(tmp_path):
    host = _host(tmp_path, l3=False)
    inst = host["instances"][0]
    state = str(tmp_path / "state")
    inst.update({key: inst[key].replace(state, state + "/") for key in ("state_dir", "releases_dir", "cache_root")})
    result = _prune(host, keep=2)
    assert result["refused"] == []
    assert _left(inst["releases_dir"]) == IDS[4:]


def test_prune_instances_takes_what_the_module_needs_from_the_plan():
    plan = [{"name": "main", "state_dir": "/s/main", "releases_dir": "/s/main/releases", "cache_root": "/s/main/cache",
             "l3": {"dir": "/l3/main/x"}, "unit_content": "not passed", "args": {"--port": 1}},
            {"name": "b", "state_dir": "/s/b", "releases_dir": "/s/b/releases", "cache_root": "/s/b/cache", "l3": {}}]
    assert F.prune_instances(plan) == [
        {"name": "main", "state_dir": "/s/main", "releases_dir": "/s/main/releases", "cache_root": "/s/main/cache",
         "l3": {"dir": "/l3/main/x"}},
        {"name": "b", "state_dir": "/s/b", "releases_dir": "/s/b/releases", "cache_root": "/s/b/cache", "l3": {}}]
