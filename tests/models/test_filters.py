"""The models role's filters (roles/models/filter_plugins/models.py) as plain functions: the plan
(versioned, deterministic paths; every input problem named), the file checks against a manifest, and
what prune may remove."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from jinja_old import expr
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
F = load("roles/models/filter_plugins/models.py")

SHA_A = "a" * 64
SHA_B = "b" * 64
DIR = "/srv/sglang/models"


def entry(path: str, sha: str = SHA_A, size: int = 10) -> dict:
    return {"path": path, "sha256": sha, "size": size}


def model(name: str = "main", **kw) -> dict:
    base = {"name": name, "source": "sync", "sync_src": "/src/" + name, "manifest": [entry("b.bin"), entry("a.json")]}
    return {**base, **kw}


def canon_hash(entries: list[dict]) -> str:
    """An independent spelling of the manifest hash: sorted [path, sha256, size] triples as JSON."""
    canon = [[e["path"], e["sha256"], int(e["size"])] for e in sorted(entries, key=lambda e: e["path"])]
    return hashlib.sha256(json.dumps(canon).encode()).hexdigest()


# --- the plan -------------------------------------------------------------------------------------
def test_versioned_path_is_the_manifest_hash_and_deterministic():
    main = model()
    plan = F.models_plan(main, model("draft"), DIR)
    assert plan["problems"] == []
    digest = canon_hash(main["manifest"])
    assert plan["paths"]["models_main"] == f"{DIR}/.store/main-{digest[:12]}"
    assert plan["models"][0]["staging"] == f"{DIR}/.staging/main-{digest[:12]}"
    assert plan["release"] == {"main": digest[:12], "draft": digest[:12]}
    # Same manifest in another order gives the same path; one changed file gives another.
    shuffled = model(manifest=list(reversed(main["manifest"])))
    assert F.models_plan(shuffled, None, DIR)["paths"]["models_main"] == plan["paths"]["models_main"]
    changed = model(manifest=[entry("b.bin", SHA_B), entry("a.json")])
    assert F.models_plan(changed, None, DIR)["paths"]["models_main"] != plan["paths"]["models_main"]


def test_disabled_draft_has_empty_path_and_no_release_entry():
    plan = F.models_plan(model(), None, DIR + "/")
    assert plan["paths"]["models_draft"] == ""
    assert list(plan["release"]) == ["main"]
    assert plan["paths"]["models_main"].startswith(DIR + "/.store/main-")


def test_files_are_sorted_with_urls_from_the_base():
    plan = F.models_plan(model(source="http", http_base_url="http://h:1/m/", sync_src=""), None, DIR)
    files = plan["models"][0]["files"]
    assert [f["path"] for f in files] == ["a.json", "b.bin"]
    assert files[0]["url"] == "http://h:1/m/a.json"
    assert plan["models"][0]["total_size"] == 20
    assert plan["problems"] == []


def test_manifest_file_list_or_files_dict(tmp_path):
    listed = tmp_path / "list.yml"
    listed.write_text(f"- {{path: x, sha256: {SHA_A}, size: 3}}\n")
    wrapped = tmp_path / "dict.json"
    wrapped.write_text(json.dumps({"files": [entry("x", SHA_A, 3)]}))
    plans = [F.models_plan(model(manifest=[], manifest_file=str(p)), None, DIR) for p in (listed, wrapped)]
    assert [p["problems"] for p in plans] == [[], []]
    assert plans[0]["paths"] == plans[1]["paths"]


@pytest.mark.parametrize(
    ("main", "draft", "models_dir", "expected"),
    [
        (model(name="a/b"), None, DIR, 'models_main.name "a/b" must be a plain directory name'),
        (model(source="ftp"), None, DIR, 'models_main.source "ftp" must be hf, http or sync'),
        (model(manifest=[]), None, DIR, "models_main: no manifest; set models_main.manifest"),
        (model(manifest=[entry("../x")]), None, DIR, 'manifest path "../x" must be relative'),
        (model(manifest=[entry("/x")]), None, DIR, 'manifest path "/x" must be relative'),
        (model(manifest=[entry("x", "zz")]), None, DIR, "manifest entry x needs a sha256 of 64 hex digits"),
        (model(manifest=[{"path": "x", "sha256": SHA_A}]), None, DIR, "manifest entry x needs a size in bytes"),
        (model(manifest=[entry("x"), entry("x")]), None, DIR, "models_main: manifest lists x more than once"),
        (model(source="hf", sync_src=""), None, DIR, "models_main.hf_repo_id is empty (source hf)"),
        (model(source="hf", hf_repo_id="o/m", hf_revision="main"), None, DIR,
         'models_main.hf_revision must pin a commit (40 hex digits), not "main"'),
        (model(source="http"), None, DIR,
         "models_main.http_base_url is empty and not every manifest entry has its own url"),
        (model(sync_src=""), None, DIR, "models_main.sync_src is empty (source sync)"),
        (model(), model(), DIR, "models_main.name and models_draft.name must differ"),
        (model(), model("d", manifest=[]), DIR, "models_draft: no manifest"),
        (model(), {}, DIR, 'models_draft.name "" must be a plain directory name'),
        (model(), None, "srv/models", 'models_dir "srv/models" must be an absolute path'),
        (model(manifest=[], manifest_file="rel.yml"), None, DIR,
         "models_main.manifest_file 'rel.yml' must be an absolute path"),
        (model(manifest=[], manifest_file="/nonexistent/m.yml"), None, DIR,
         "models_main.manifest_file /nonexistent/m.yml cannot be read on the controller"),
    ],
)
def test_each_input_problem_is_named(main, draft, models_dir, expected):
    problems = F.models_plan(main, draft, models_dir)["problems"]
    assert any(expected in p for p in problems), problems


def test_http_entries_with_own_urls_need_no_base():
    main = model(source="http", sync_src="", manifest=[{**entry("x"), "url": "http://h/x"}])
    plan = F.models_plan(main, None, DIR)
    assert plan["problems"] == []
    assert plan["models"][0]["files"][0]["url"] == "http://h/x"
    assert "own_url" not in plan["models"][0]["files"][0]


def test_manifest_file_that_is_not_a_list(tmp_path):
    bad = tmp_path / "m.yml"
    bad.write_text("just a string\n")
    problems = F.models_plan(model(manifest=[], manifest_file=str(bad)), None, DIR)["problems"]
    assert any("must hold a list of files" in p for p in problems), problems


# --- file checks ----------------------------------------------------------------------------------
def stat_result(path: str, exists: bool = True, size: int = 10, checksum: str = SHA_A) -> dict:
    stat = {"exists": exists, "size": size, "checksum": checksum} if exists else {"exists": False}
    return {"item": entry(path), "stat": stat}


def test_file_problems_by_size_and_by_sha256():
    results = [
        stat_result("ok"),
        stat_result("gone", exists=False),
        stat_result("short", size=9),
        stat_result("flipped", checksum=SHA_B),
        {"item": entry("skipped"), "skipped": True},
    ]
    by_size = F.models_file_problems(results, False)
    assert [b["path"] for b in by_size] == ["gone", "short"]
    assert by_size[1]["msg"] == "short: 9 bytes, manifest says 10"
    by_sha = F.models_file_problems(results, True)
    assert [b["path"] for b in by_sha] == ["gone", "short", "flipped"]
    assert by_sha[2]["msg"] == f"flipped: sha256 {SHA_B} (10 bytes), manifest says {SHA_A} (10 bytes)"
    assert by_sha[0]["msg"] == "gone is missing"


# --- the filter that replaced the ternaries of tasks/fetch-hf.yml, against the old Jinja -----------

OLD_HF_ENV = (
    "{'HF_HUB_DISABLE_TELEMETRY': '1', 'HF_HUB_DISABLE_PROGRESS_BARS': '1'}"
    " | combine((endpoint | length > 0) | ternary({'HF_ENDPOINT': endpoint}, {}))"
    " | combine((token | length > 0) | ternary({'HF_TOKEN_PATH': token_file}, {}))"
)


@pytest.mark.parametrize("endpoint", ["", "https://hf-mirror.lan"])
@pytest.mark.parametrize("token", ["", "hf_x"])
def test_hf_env(endpoint, token):
    names = {"endpoint": endpoint, "token": token, "token_file": "/root/.cache/hicache-fleet/hf-token"}
    assert F.models_hf_env(endpoint, token, names["token_file"]) == expr(OLD_HF_ENV, **names)


@pytest.mark.parametrize("cli", ["", "/usr/local/bin/hf"])
def test_hf_cli(cli):
    old = expr("(cli | length > 0) | ternary(cli, venv ~ '/bin/hf')", cli=cli, venv="/opt/hf")
    assert expr("cli or venv ~ '/bin/hf'", cli=cli, venv="/opt/hf") == old
