"""Issue 24: preflight plans the models with the models role's own plan logic (its entry point
`check`), so a bad manifest is refused in preflight, naming the variable, before the ROCm and venv
phases change a host. The REAL playbooks/preflight.yml on localhost (connection local), one run with
two hosts: `bad` (a manifest path the download tool would read as an option, a control character,
and a sync from the controller whose model directory links out to a key) and `good` (the same model
directory without the link out)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from test_preflight_inputs import BASE, HOST_ONLY, _findings, _host_outcome, _run

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n"


def _entry(root: Path, name: str) -> dict:
    data = (root / name).read_bytes()
    return {"path": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


@pytest.fixture(scope="module")
def models_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    (tmp / "ssh").mkdir()
    (tmp / "ssh" / "id_ed25519").write_bytes(SECRET)
    good_dir, bad_dir = tmp / "good", tmp / "bad"
    for root in (good_dir, bad_dir):
        root.mkdir()
        (root / "config.json").write_bytes(b"{}\n")
    (bad_dir / "tokenizer.json").symlink_to(tmp / "ssh" / "id_ed25519")
    good = {"name": "m", "source": "sync", "sync_src": str(good_dir), "manifest": [_entry(good_dir, "config.json")]}
    bad = {"name": "m", "source": "sync", "sync_src": str(bad_dir),
           "manifest": [_entry(bad_dir, "config.json"), _entry(bad_dir, "tokenizer.json"),
                        {"path": "--help", "sha256": "a" * 64, "size": 1},
                        {"path": "w.bin\n", "sha256": "a" * 64, "size": 1}]}
    hosts = {}
    for name, model in (("bad", bad), ("good", good)):
        hosts[name] = dict(BASE, preflight_check_models=True, models_main=model, models_draft_enabled=False,
                           ansible_connection="local", ansible_python_interpreter=sys.executable)
    inventory = tmp / "hosts.yml"
    inventory.write_text(json.dumps({"sglang_hosts": {"hosts": hosts}}), encoding="utf-8")
    return _run(tmp, {}, inventory=str(inventory)), tmp


def test_preflight_refuses_a_bad_manifest_naming_the_variable(models_run):
    run, tmp = models_run
    status, block = _host_outcome(run.stdout, "bad")
    assert status == "fatal", run.stdout[-4000:]
    findings = [f for f in _findings(block) if not HOST_ONLY.search(f)]
    assert findings == [
        'models_main: manifest path "--help" must not start with "-" (the download tool would read it as an option) '
        "(roles/models)",
        'models_main: manifest path "w.bin\\n" holds a control character (roles/models)',
        f'models_main: manifest file "tokenizer.json" resolves to {tmp}/ssh/id_ed25519 on the controller, outside '
        f"models_main.sync_src {tmp}/bad (a symbolic link): model files must lie inside their model directory; put "
        "the file itself there, or fix the manifest (roles/models)",
    ], findings


def test_preflight_passes_good_models_and_publishes_no_model_path(models_run):
    run, _ = models_run
    status, block = _host_outcome(run.stdout, "good")
    findings = [f for f in _findings(block) if not HOST_ONLY.search(f)] if status == "fatal" else []
    assert findings == [], run.stdout[-4000:]
    assert ("TASK [models : Plan | resolve the models (manifests, versioned paths) and publish the input problems]"
            in run.stdout)
    assert "Plan | publish the versioned model paths" not in run.stdout
    assert "List why the models were not planned" not in run.stdout


def test_a_models_plan_failure_becomes_findings():
    from plugins import load

    pi = load("roles/preflight/filter_plugins/preflight_inputs.py", "preflight_inputs_models")
    assert pi.models_plan_findings(["models_main: a", "models_draft:  b\n c"]) == [
        "models_main: a (roles/models)", "models_draft: b c (roles/models)"]
    spec = pi.models_plan_findings({"argument_errors": ["models_main must be a dict"]},
                                   "ansible.builtin.validate_argument_spec")
    assert spec == ["the models were not planned: their variables fail the argument specs of the models role "
                    "(models_main must be a dict); fix them in the inventory first."]
    assert pi.models_plan_findings({"msg": "templating error"}, "ansible.builtin.set_fact") == [
        "the models could not be planned (templating error); fix models_main / models_draft first."]
