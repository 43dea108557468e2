"""The models role's prune as one module call (library/models_prune.py, module_utils/fleet_models_prune.py):
the keep list's refusals, what a kept path keeps, and the run on a real directory tree (links of the
earlier layout, a kept link's target, check mode, a second run that changes nothing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from plugins import adhoc_module, load

REPO = Path(__file__).resolve().parents[2]
P = load(REPO / "module_utils" / "fleet_models_prune.py")
DIR = "/srv/sglang/models"


# --- prune ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("keep", "expected"),
    [
        ([], "models_prune_keep is empty: refusing to prune"),
        ("/srv/sglang/models/.store/x", "must be a list of absolute paths, not str"),
        (None, "must be a list of absolute paths, not NoneType"),
        (["relative/x"], 'entry "relative/x" is not an absolute path'),
        (["/opt/sglang/releases/r1"], "names nothing under models_dir (/srv/sglang/models): refusing to prune"),
    ],
)
def test_prune_refuses_unusable_keep_lists(keep, expected):
    problems = P.keep_problems(keep, DIR)
    assert any(expected in p for p in problems), problems


def test_prune_accepts_a_keep_list_with_a_model_path():
    assert P.keep_problems(["/opt/venv", f"{DIR}/.store/m-abc"], DIR + "/") == []


def test_prune_removes_exactly_what_no_kept_path_names():
    found = [
        f"{DIR}/.store/m-111111111111",
        f"{DIR}/.store/m-222222222222",
        f"{DIR}/.store/m-333333333333.damaged-20261201T000000",
        f"{DIR}/.store/m-444444444444-20261130T010203",
        f"{DIR}/.staging/m-555555555555",
        f"{DIR}/legacy",
    ]
    keep = [
        f"{DIR}/.store/m-111111111111/",  # trailing slash
        f"{DIR}/.store/m-444444444444-20261130T010203/config.json",  # a path inside a copy keeps the copy
        f"{DIR}/.store/m-333333333333",  # names the clean copy, not the damaged one beside it
    ]
    assert P.prune_paths(found, keep) == [
        f"{DIR}/.staging/m-555555555555",
        f"{DIR}/.store/m-222222222222",
        f"{DIR}/.store/m-333333333333.damaged-20261201T000000",
        f"{DIR}/legacy",
    ]
    assert P.prune_paths(found, found) == []



def _tree(root: Path) -> dict[str, Path]:
    """A models_dir as the role leaves it: store copies, a download, a damaged copy, links."""
    store, staging = root / ".store", root / ".staging"
    paths = {
        "current": store / "m-111111111111",
        "previous": store / "m-222222222222",
        "old": store / "m-333333333333",
        "damaged": store / "m-111111111111.damaged-20261201T000000",
        "download": staging / "m-444444444444",
        "planned": staging / "m-555555555555",
    }
    for path in paths.values():
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")
    (store / ".hidden-partial").write_text("x")
    # The earlier layout's links: one into the store as written (the role's), one elsewhere (not).
    os.symlink(str(paths["old"]), root / "legacy-old")
    os.symlink("/opt/elsewhere", root / "not-ours")
    # A kept link outside models_dir that resolves to the previous copy keeps it.
    return paths


def test_prune_removes_what_no_kept_path_names_and_keeps_the_rest(tmp_path):
    root = tmp_path / "models"
    paths = _tree(root)
    link = tmp_path / "release-previous-model"
    os.symlink(str(paths["previous"]), link)
    keep = [str(paths["current"]), str(link)]
    plan = [str(root / ".store" / "m-555555555555"), str(paths["planned"])]
    found = P.prune(str(root), keep, plan, check_mode=True)
    expected = sorted([str(paths["old"]), str(paths["damaged"]), str(paths["download"]),
                       str(root / ".store" / ".hidden-partial"), str(root / "legacy-old")])
    assert found["removed"] == expected
    assert found["changed"] is True
    # Check mode removed nothing.
    assert all(os.path.lexists(p) for p in expected)
    done = P.prune(str(root), keep, plan, check_mode=False)
    assert done["removed"] == expected
    assert not any(os.path.lexists(p) for p in expected)
    for kept in ("current", "previous", "planned"):
        assert (paths[kept] / "config.json").exists(), kept
    # A link that is not the role's stays; the kept link's target is kept, the link itself untouched.
    assert os.path.islink(root / "not-ours")
    assert str(paths["previous"]) in done["kept"]
    # A second run has nothing to remove.
    again = P.prune(str(root), keep, plan, check_mode=False)
    assert again["removed"] == []
    assert again["changed"] is False


def test_prune_refuses_before_it_removes_anything(tmp_path):
    root = tmp_path / "models"
    paths = _tree(root)
    with pytest.raises(ValueError, match="names nothing under models_dir"):
        P.prune(str(root), ["/opt/sglang/releases/r1"], [], check_mode=False)
    assert all(p.exists() for p in paths.values())


def test_a_failed_removal_says_what_went_before_it(tmp_path, monkeypatch):
    root = tmp_path / "models"
    paths = _tree(root)
    real_remove = P.remove

    def remove(path):
        if path == str(paths["old"]):
            raise PermissionError(13, "Permission denied", path)
        real_remove(path)

    monkeypatch.setattr(P, "remove", remove)
    with pytest.raises(P.PruneError) as failed:
        P.prune(str(root), [str(paths["current"])], [str(paths["planned"])], check_mode=False)
    assert failed.value.removed
    assert all(not os.path.lexists(p) for p in failed.value.removed)
    assert paths["old"].exists()
    assert f"could not remove {paths['old']}: Permission denied" in str(failed.value)


def test_the_module_prunes_on_the_host_and_says_what_went(tmp_path):
    """The module as Ansible runs it (ad hoc on localhost): check mode with --diff, the run, the refusal."""
    root = tmp_path / "models"
    paths = _tree(root)
    args = {"models_dir": str(root), "keep": [str(paths["current"])], "plan_paths": [str(paths["planned"])]}
    rc, out = _adhoc(tmp_path, args, "--check", "--diff")
    assert rc == 0, out
    assert out["changed"] is True
    assert str(paths["old"]) in out["removed"]
    assert paths["old"].exists()
    rc, out = _adhoc(tmp_path, args)
    assert rc == 0, out
    assert not paths["old"].exists()
    assert paths["current"].exists()
    rc, out = _adhoc(tmp_path, {**args, "keep": []})
    assert rc != 0
    assert "models_prune_keep is empty" in out["msg"]


def _adhoc(tmp_path: Path, args: dict, *flags: str) -> tuple[int, dict]:
    return adhoc_module(tmp_path, "models_prune", args, *flags)
