"""Verify models on the real test host after converge, idempotence and side_effect.yml (a second
draft revision staged, failure paths, prune keeping main v1 and draft v2): each revision lives in
.store/<name>-<manifest sha256[:12]> (the hash computed here, independently of the role), its files
match its manifest byte for byte, its marker holds the manifest's hash, nothing else is left in the
store or in staging, no fixed link is left, and the fixture server really ran inside the guest."""

import hashlib
import json
import os
import shlex

import pytest
import testinfra.utils.ansible_runner
import yaml

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

FIXTURES = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "fixtures")
MODELS_DIR = "/srv/sglang/models"
# Model name -> the manifest of the revision that must be left after side_effect.yml's prune.
MODELS = {"fixture-main": "fixture-main", "fixture-draft": "fixture-draft-v2"}


def manifest(name):
    with open(os.path.join(FIXTURES, f"{name}.manifest.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def manifest_sha256(entries):
    canon = [[e["path"], e["sha256"], int(e["size"])] for e in sorted(entries, key=lambda e: e["path"])]
    return hashlib.sha256(json.dumps(canon).encode()).hexdigest()


def revision(name):
    return f"{MODELS_DIR}/.store/{name}-{manifest_sha256(manifest(MODELS[name]))[:12]}"


@pytest.mark.parametrize("name", MODELS)
def test_revision_is_a_directory_named_by_its_manifest_hash(host, name):
    copy = host.file(revision(name))
    assert copy.is_directory
    assert not copy.is_symlink
    assert (copy.user, copy.mode) == ("root", 0o755)


@pytest.mark.parametrize("name", MODELS)
def test_marker_holds_manifest_hash(host, name):
    marker = json.loads(host.file(f"{revision(name)}/.hicache-fleet-model.json").content_string)
    entries = manifest(MODELS[name])
    assert marker["manifest_sha256"] == manifest_sha256(entries)
    assert marker["files"] == len(entries)
    assert marker["bytes"] == sum(int(e["size"]) for e in entries)


@pytest.mark.parametrize("name", MODELS)
def test_every_file_matches_manifest(host, name):
    entries = manifest(MODELS[name])
    root = f"{revision(name)}/"
    # Two commands for all files (testinfra runs each one through Ansible, which is slow).
    paths = " ".join(shlex.quote(e["path"]) for e in entries)
    sums = host.run("cd %s && sha256sum -- " + paths, root)
    stats = host.run("cd %s && stat -c %s -- " + paths, root, "%n %s %U %a")
    assert sums.rc == 0, sums.stderr
    assert stats.rc == 0, stats.stderr
    sha256 = {path: digest for digest, path in (line.split(None, 1) for line in sums.stdout.splitlines())}
    meta = {path: rest for path, *rest in (line.split() for line in stats.stdout.splitlines())}
    for entry in entries:
        assert sha256[entry["path"]] == entry["sha256"], entry["path"]
        size, owner, mode = meta[entry["path"]]
        assert (int(size), owner, mode) == (int(entry["size"]), "root", "644"), entry["path"]


def test_the_two_draft_revisions_differ_in_their_weights():
    v1 = {e["path"]: e["sha256"] for e in manifest("fixture-draft")}
    v2 = {e["path"]: e["sha256"] for e in manifest("fixture-draft-v2")}
    assert v1.keys() == v2.keys()
    assert [p for p in v1 if v1[p] != v2[p]] == ["model.safetensors"]


def test_safetensors_were_served_not_only_configs(host):
    paths = [e["path"] for e in manifest("fixture-main")]
    assert "model-00001-of-00002.safetensors" in paths
    assert "original/params.safetensors" in paths
    assert host.file(f"{revision('fixture-main')}/original").mode == 0o755


def test_store_holds_exactly_the_kept_revisions_and_nothing_else(host):
    assert host.run(f"ls -A {MODELS_DIR}/.staging").stdout.strip() == ""
    copies = sorted(host.run(f"ls -A {MODELS_DIR}/.store").stdout.split())
    assert copies == sorted(os.path.basename(revision(n)) for n in MODELS)
    # No fixed link per model: the service names each revision by its path.
    assert sorted(host.run(f"ls -A {MODELS_DIR}").stdout.split()) == [".staging", ".store"]


def test_fixture_server_ran_in_the_guest(host):
    unit = host.service("models-fixture-http")
    assert unit.is_running, host.run("journalctl -u models-fixture-http --no-pager -n 20").stdout
    address = host.ansible.get_variables()["ansible_host"]
    assert host.socket(f"tcp://{address}:8815").is_listening
    # The corrupted extra file of side_effect.yml was served, and was never installed.
    assert host.file("/srv/fixture-http/fixture-main/extra.safetensors").exists
    assert host.run(f"find {MODELS_DIR} -name extra.safetensors").stdout == ""
