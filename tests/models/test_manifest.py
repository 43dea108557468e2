"""playbooks/model_manifest.yml (the models role's `tasks_from: manifest`) run for real with
ansible-playbook on the controller: from a local directory (every file hashed, hidden ones left out),
and from a pinned Hugging Face revision served by a local stand-in of the Hub's tree and resolve
endpoints (fixtures/README.md). The written manifest is the one the role then accepts; bad input
and a missing manifest file get the role's messages."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
F = load("roles/models/filter_plugins/models.py")
FIXTURES = Path(__file__).parent / "fixtures"
BIN = Path(sys.executable).parent
REPO = "fixture-org/tiny-qwen"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = bytes(range(256)) * 64


def run_playbook(playbook: Path | str, *extra: str, inventory: str = "localhost,") -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_FACT_CACHING": "memory", "ANSIBLE_ROLES_PATH": str(ROOT / "roles")}
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", inventory, str(playbook), *extra],
                          capture_output=True, text=True, env=env, timeout=300, check=False, cwd=ROOT)


def manifest(*args: str) -> subprocess.CompletedProcess:
    return run_playbook(ROOT / "playbooks/model_manifest.yml", *args)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def model_dir(tmp_path):
    root = tmp_path / "model"
    (root / "sub").mkdir(parents=True)
    (root / ".cache" / "huggingface").mkdir(parents=True)
    (root / "config.json").write_bytes(b'{"model_type": "qwen3"}\n')
    (root / "sub" / "model-00001-of-00001.safetensors").write_bytes(WEIGHTS)
    (root / ".cache" / "huggingface" / "download.lock").write_text("hf's own metadata\n")
    (root / ".hidden").write_text("left out\n")
    return root


def test_local_directory(model_dir, tmp_path):
    out = tmp_path / "main.manifest.yml"
    result = manifest("-e", f"models_manifest_dir={model_dir}", "-e", f"models_manifest_out={out}")
    assert result.returncode == 0, result.stdout[-3000:]
    doc = yaml.safe_load(out.read_text())
    assert doc["files"] == [
        {"path": "config.json", "sha256": sha(b'{"model_type": "qwen3"}\n'), "size": 24},
        {"path": "sub/model-00001-of-00001.safetensors", "sha256": sha(WEIGHTS), "size": len(WEIGHTS)},
    ]
    assert out.read_text().startswith(f"# sha256 manifest written by playbooks/model_manifest.yml from\n"
                                      f"# the local directory {model_dir};")
    # The role reads it as it is, and the store directory the playbook announced is the plan's.
    plan = F.models_plan({"name": "m", "source": "sync", "sync_src": str(model_dir), "manifest_file": str(out)},
                         None, "/srv/sglang/models")
    assert plan["problems"] == []
    assert plan["paths"]["models_main"].endswith("/m-" + plan["release"]["m"])
    assert f"will be <name>-{plan['release']['m']}" in result.stdout.replace("\n", " ").replace("  ", " ")
    # A second run writes the same bytes: no change.
    again = manifest("-e", f"models_manifest_dir={model_dir}", "-e", f"models_manifest_out={out}")
    assert again.returncode == 0
    assert "changed=0" in again.stdout


class Hub(BaseHTTPRequestHandler):
    """The two Hub endpoints the playbook reads, answering from tests/models/fixtures."""

    requests: list[dict] = []  # noqa: RUF012 (shared by the test and the server thread)

    def do_GET(self):
        Hub.requests.append({"path": self.path, "authorization": self.headers.get("Authorization")})
        tree = f"/api/models/{REPO}/tree/{COMMIT}?recursive=true"
        prefix = f"/{REPO}/resolve/{COMMIT}/"
        if self.path == tree:
            body, kind = (FIXTURES / "hf-tree-response.json").read_bytes(), "application/json"
        elif self.path.startswith(prefix) and (FIXTURES / "hf-repo" / self.path[len(prefix):]).is_file():
            body, kind = (FIXTURES / "hf-repo" / self.path[len(prefix):]).read_bytes(), "application/octet-stream"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        return


@pytest.fixture
def hub():
    Hub.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_pinned_hf_revision(hub, tmp_path):
    out = tmp_path / "draft.manifest.yml"
    result = manifest("-e", f"models_manifest_hf_repo_id={REPO}", "-e", f"models_manifest_hf_revision={COMMIT}",
                      "-e", f"models_manifest_hf_endpoint={hub}", "-e", "models_manifest_hf_token=hf_secret_token",
                      "-e", f"models_manifest_out={out}")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "hf_secret_token" not in result.stdout
    doc = yaml.safe_load(out.read_text())
    tree = json.loads((FIXTURES / "hf-tree-response.json").read_text())
    lfs = {e["path"]: e["lfs"] for e in tree if "lfs" in e}
    repo = FIXTURES / "hf-repo"
    assert doc["hf_repo_id"] == REPO
    assert doc["hf_revision"] == COMMIT
    assert doc["files"] == [
        {"path": ".gitattributes", "sha256": sha((repo / ".gitattributes").read_bytes()),
         "size": len((repo / ".gitattributes").read_bytes())},
        {"path": "config.json", "sha256": sha((repo / "config.json").read_bytes()),
         "size": len((repo / "config.json").read_bytes())},
        {"path": "model.safetensors", "sha256": sha(WEIGHTS), "size": len(WEIGHTS)},
        {"path": "tokenizer/tokenizer.json", "sha256": lfs["tokenizer/tokenizer.json"]["oid"],
         "size": lfs["tokenizer/tokenizer.json"]["size"]},
    ]
    # Only the pinned commit was asked for; the LFS files were never downloaded; the token went along.
    paths = [r["path"] for r in Hub.requests]
    assert paths[0] == f"/api/models/{REPO}/tree/{COMMIT}?recursive=true"
    assert sorted(paths[1:]) == [f"/{REPO}/resolve/{COMMIT}/.gitattributes", f"/{REPO}/resolve/{COMMIT}/config.json"]
    assert {r["authorization"] for r in Hub.requests} == {"Bearer hf_secret_token"}
    model = {"name": "d", "source": "hf", "hf_repo_id": REPO, "hf_revision": COMMIT, "manifest_file": str(out)}
    assert F.models_plan(model, None, "/srv/sglang/models")["problems"] == []


def test_a_branch_is_not_a_pinned_revision(hub, tmp_path):
    out = tmp_path / "m.yml"
    result = manifest("-e", f"models_manifest_hf_repo_id={REPO}", "-e", "models_manifest_hf_revision=main",
                      "-e", f"models_manifest_hf_endpoint={hub}", "-e", f"models_manifest_out={out}")
    assert result.returncode != 0
    assert "models_manifest_hf_revision pinned to a commit (40 hex digits, not a branch: 'main')" in result.stdout
    assert Hub.requests == []
    assert not out.exists()


def test_both_sources_or_a_relative_output_refused(model_dir, tmp_path):
    result = manifest("-e", f"models_manifest_dir={model_dir}", "-e", f"models_manifest_hf_repo_id={REPO}",
                      "-e", f"models_manifest_hf_revision={COMMIT}", "-e", f"models_manifest_out={tmp_path}/m.yml")
    assert result.returncode != 0
    assert "Give exactly one source" in result.stdout
    result = manifest("-e", f"models_manifest_dir={model_dir}", "-e", "models_manifest_out=m.yml")
    assert result.returncode != 0
    assert "models_manifest_out, an absolute" in result.stdout


def test_tree_listing_filter():
    tree = json.loads((FIXTURES / "hf-tree-response.json").read_text())
    got = F.models_manifest_from_hf_tree(tree, REPO, COMMIT)
    assert [f["path"] for f in got["files"]] == ["model.safetensors", "tokenizer/tokenizer.json"]
    assert [f["path"] for f in got["to_hash"]] == [".gitattributes", "config.json"]
    assert got["problems"] == []
    assert F.models_manifest_from_hf_tree({"error": "Revision not found"}, REPO, COMMIT)["problems"] == [
        f"{REPO}@{COMMIT}: the tree API did not answer with a list"]


def test_missing_manifest_file_gets_the_role_message(tmp_path):
    """The example inventory names manifest files that do not exist yet: the role says so and how
    to write them (no lookup error)."""
    play = tmp_path / "plan.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "sglang_hosts[0]", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [{"ansible.builtin.include_role": {"name": "models", "tasks_from": "plan"}}],
    }]))
    result = run_playbook(play, inventory=str(ROOT / "inventories/example"))
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert "roles/models: 8 problem(s) in the model variables" in text
    assert (f"models_main.manifest_file {ROOT}/inventories/example/files/models/main.manifest.yml cannot be read on "
            "the controller: No such file or directory; write it with playbooks/model_manifest.yml") in text
    assert "lookup" not in text.lower()


def test_get_url_checksum_refusal_named_like_a_mismatch():
    want, got = "a" * 64, "b" * 64
    results = [
        {"item": {"path": "extra.safetensors", "size": 262144}, "failed": True,
         "msg": f"The checksum for /srv/x/.staging/m/extra.safetensors.tmp did not match {want}; it was {got}."},
        {"item": {"path": "config.json", "size": 10}, "failed": True,
         "msg": "Request failed: HTTP Error 404: Not Found"},
        {"item": {"path": "ok.bin", "size": 1}, "changed": True},
    ]
    errors = F.models_fetch_errors(results)
    assert errors == {
        "extra.safetensors": f"sha256 {got} (the download, removed by get_url), manifest says {want} (262144 bytes)",
        "config.json": "Request failed: HTTP Error 404: Not Found",
    }
    stats = [{"item": {"path": p, "sha256": want, "size": 1}, "stat": {"exists": False}}
             for p in ("extra.safetensors", "config.json", "gone.bin")]
    msgs = [b["msg"] for b in F.models_file_problems(stats, True, errors)]
    assert msgs == [f"extra.safetensors: sha256 {got} (the download, removed by get_url), manifest says {want} "
                    "(262144 bytes)", "config.json: Request failed: HTTP Error 404: Not Found", "gone.bin is missing"]


def test_manifest_from_find_leaves_hidden_files_out():
    found = [{"path": "/m/a.json", "checksum": "1" * 64, "size": 3},
             {"path": "/m/.cache/huggingface/x.lock", "checksum": "2" * 64, "size": 1},
             {"path": "/m/sub/.hicache-fleet-model.json", "checksum": "3" * 64, "size": 1},
             {"path": "/m/sub/w.bin", "checksum": "4" * 64, "size": 9}]
    assert [f["path"] for f in F.models_manifest_from_find(found, "/m/")] == ["a.json", "sub/w.bin"]
    assert len(F.models_manifest_from_find(found, "/m", include_hidden=True)) == 4
