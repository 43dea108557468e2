"""The sglang_service filters behind a host release (what changes, what a release names) and the rule of what
is pruned (module_utils/sglang_service_release.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from plugins import load

ROOT = Path(__file__).resolve().parents[2]


def _filters():
    return load("roles/sglang_service/filter_plugins/sglang_service.py")


def _sum(text: str) -> dict:
    return {"stat": {"exists": True, "checksum": hashlib.sha256(text.encode()).hexdigest()}}


def test_release_record_names_the_venv_and_the_model_revisions():
    f = _filters()
    instance = {
        "name": "main", "unit": "sglang-main.service", "bind": "127.0.0.1", "port": "30000",
        "profile": "seed-validated", "hicache": True, "api_key_set": False, "config_hash": "f" * 64,
        "components": {"rocm": "abc"}, "unit_content": "not recorded",
        "args": {"--model-path": "/srv/m/.store/main-111111111111",
                 "--speculative-draft-model-path": "/srv/m/.store/draft-222222222222", "--tp-size": 2},
    }
    record = f.release_record(instance, "/opt/sglang/venvs/0.5.23-x-1a2b/bin/python")
    assert record["venv"] == "/opt/sglang/venvs/0.5.23-x-1a2b"
    assert record["model_paths"] == ["/srv/m/.store/main-111111111111", "/srv/m/.store/draft-222222222222"]
    assert record["port"] == 30000
    assert record["components"] == {"rocm": "abc"}
    assert "unit_content" not in record
    assert "args" not in record


def test_release_record_without_a_draft_model():
    instance = {"name": "m", "args": {"--model-path": "/m", "--speculative-draft-model-path": ""}}
    record = _filters().release_record(instance, "/v/bin/python")
    assert record["model_paths"] == ["/m"]


def test_prune_keeps_protected_ids_and_paths():
    f = load("module_utils/sglang_service_release.py")
    found = [{"path": f"/r/{c * 12}", "mtime": i} for i, c in enumerate("abcdef")]
    # Newest two kept by count (f, e); d by path; a by its full config hash.
    assert f.prune_releases(found, 2, ["/r/" + "d" * 12], ["a" * 64]) == ["/r/" + "c" * 12, "/r/" + "b" * 12]
    assert f.prune_releases(found, 6, [], []) == []
