"""Verify models on the real test host after converge, idempotence and the failure paths of
side_effect.yml: each model path is a symlink to one verified copy in .store whose files match the
manifest byte for byte, the marker holds the manifest's hash, nothing half-downloaded is left, and
the fixture server really ran inside the guest."""

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
MODELS = ["fixture-main", "fixture-draft"]


def manifest(name):
    with open(os.path.join(FIXTURES, f"{name}.manifest.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def manifest_sha256(entries):
    canon = [[e["path"], e["sha256"], int(e["size"])] for e in sorted(entries, key=lambda e: e["path"])]
    return hashlib.sha256(json.dumps(canon).encode()).hexdigest()


@pytest.mark.parametrize("name", MODELS)
def test_model_path_is_link_to_verified_copy(host, name):
    link = host.file(f"{MODELS_DIR}/{name}")
    assert link.is_symlink
    assert link.linked_to.startswith(f"{MODELS_DIR}/.store/{name}-{manifest_sha256(manifest(name))[:12]}-")


@pytest.mark.parametrize("name", MODELS)
def test_marker_holds_manifest_hash(host, name):
    marker = json.loads(host.file(f"{MODELS_DIR}/{name}/.hicache-fleet-model.json").content_string)
    entries = manifest(name)
    assert marker["manifest_sha256"] == manifest_sha256(entries)
    assert marker["files"] == len(entries)
    assert marker["bytes"] == sum(int(e["size"]) for e in entries)


@pytest.mark.parametrize("name", MODELS)
def test_every_file_matches_manifest(host, name):
    entries = manifest(name)
    root = f"{MODELS_DIR}/{name}/"
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


def test_safetensors_were_served_not_only_configs(host):
    paths = [e["path"] for e in manifest("fixture-main")]
    assert "model-00001-of-00002.safetensors" in paths
    assert "original/params.safetensors" in paths
    assert host.file(f"{MODELS_DIR}/fixture-main/original").mode == 0o755


def test_nothing_half_downloaded_left(host):
    assert host.run(f"ls -A {MODELS_DIR}/.staging").stdout.strip() == ""
    copies = sorted(host.run(f"ls -A {MODELS_DIR}/.store").stdout.split())
    assert len(copies) == 2, copies
    assert sorted(os.path.basename(host.file(f"{MODELS_DIR}/{n}").linked_to) for n in MODELS) == copies


def test_fixture_server_ran_in_the_guest(host):
    unit = host.service("models-fixture-http")
    assert unit.is_running, host.run("journalctl -u models-fixture-http --no-pager -n 20").stdout
    address = host.ansible.get_variables()["ansible_host"]
    assert host.socket(f"tcp://{address}:8815").is_listening
    # The corrupted extra file of side_effect.yml was served, and was never installed.
    assert host.file("/srv/fixture-http/fixture-main/extra.safetensors").exists
    assert not host.file(f"{MODELS_DIR}/fixture-main/extra.safetensors").exists
