"""The controller's fingerprint of a host's desired release (roles/rollout/filter_plugins/
rollout_converged.py), which site.yml's fast path compares with the host's record: what changes it
(a role option, a file an option names, the toolkit's own files) and what does not (a variable no
role reads, documentation, the order in which the inventory lists things)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from plugins import load

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the toolkit's files the fingerprint reads (the roles' specs and the trees)."""
    copy = tmp_path / "project"
    copy.mkdir()
    for top in ("site.yml", "ansible.cfg"):
        shutil.copy(ROOT / top, copy / top)
    for top in ("playbooks", "roles", "library", "module_utils", "callback_plugins"):
        shutil.copytree(ROOT / top, copy / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy


def fingerprint(project: Path, host_vars: dict, raw: dict | None = None) -> str:
    # A fresh load each time: the filter caches the toolkit's digest per process.
    module = load("roles/rollout/filter_plugins/rollout_converged.py")
    toolkit = module.rollout_release_toolkit(str(project))
    return module.rollout_release_fingerprint(host_vars, raw if raw is not None else host_vars, toolkit)


class Templating(dict):
    """hostvars[host] as Ansible hands it over: values templated on access, some not yet possible."""

    def __init__(self, values: dict, failing: set[str]):
        super().__init__(values)
        self.failing = failing

    def __getitem__(self, name):
        if name in self.failing:
            raise RuntimeError(f"'{name}' needs facts that are not gathered yet")
        return super().__getitem__(name)


def test_the_same_inputs_give_the_same_fingerprint_and_unrelated_ones_do_not_count(project):
    base = {"sglang_service_hicache_args": {"--hicache-size": 2, "--hicache-ratio": "2.0"}, "rocm_version": "7.2"}
    first = fingerprint(project, base)
    assert len(first) == 64
    # Key order, a variable no role declares, and connection settings are not the release.
    reordered = {"rocm_version": "7.2", "sglang_service_hicache_args": {"--hicache-ratio": "2.0", "--hicache-size": 2}}
    assert fingerprint(project, {**reordered, "my_note": "x", "ansible_host": "10.0.0.9"}) == first
    # A run setting (the canary, the report note) is not the release either.
    assert fingerprint(project, {**base, "rollout_canary": "h9", "rollout_report_note": "Tuesday"}) == first


def test_a_role_option_changes_it(project):
    base = {"sglang_service_hicache_args": {"--hicache-size": 2}}
    assert fingerprint(project, {"sglang_service_hicache_args": {"--hicache-size": 4}}) != fingerprint(project, base)
    assert fingerprint(project, {**base, "models_main": {"name": "m"}}) != fingerprint(project, base)


def test_a_file_an_option_names_changes_it_when_edited_in_place(project, tmp_path):
    manifest = tmp_path / "main.manifest.yml"
    manifest.write_text("files: {a.safetensors: abc}\n")
    values = {"models_main": {"name": "m", "manifest_file": str(manifest)}}
    before = fingerprint(project, values)
    manifest.write_text("files: {a.safetensors: def}\n")
    assert fingerprint(project, values) != before


def test_the_toolkits_own_files_change_it_but_not_its_docs(project):
    values = {"rocm_version": "7.2"}
    before = fingerprint(project, values)
    (project / "roles" / "rollout" / "README.md").write_text("other words\n")
    assert fingerprint(project, values) == before
    template = project / "roles" / "sglang_service" / "templates" / "sglang.service.j2"
    template.write_text(template.read_text() + "# a new line in the unit template\n")
    assert fingerprint(project, values) != before


def test_a_value_that_cannot_be_templated_yet_counts_by_its_raw_text(project):
    raw = {"sglang_service_memory_reserve_gb": "{{ ansible_memtotal_mb // 2048 }}", "rocm_version": "7.2"}
    values = Templating({"sglang_service_memory_reserve_gb": None, "rocm_version": "7.2"},
                        {"sglang_service_memory_reserve_gb"})
    first = fingerprint(project, values, raw)
    assert first == fingerprint(project, values, dict(raw))
    raw_changed = {**raw, "sglang_service_memory_reserve_gb": "{{ ansible_memtotal_mb // 4096 }}"}
    assert fingerprint(project, values, raw_changed) != first


def test_what_the_run_itself_sets_does_not_count(project):
    """rocm_release is a role option and also set by the rocm role (set_fact, cached): the value cached
    from the last run describes that run, so it must not make the next run look like a new release."""
    base = {"rocm_source": "distro", "rocm_distro_packages": []}
    first = fingerprint(project, {**base, "rocm_release": {"packages": {"rocminfo": None}}})
    assert fingerprint(project, {**base, "rocm_release": {"packages": {"librocm-smi-dev": None}}}) == first
    assert fingerprint(project, {**base, "rocm_distro_packages": ["librocm-smi-dev"]}) != first


def phases(project: Path, host_vars: dict) -> dict[str, str]:
    module = load("roles/rollout/filter_plugins/rollout_converged.py")
    toolkit = module.rollout_release_toolkit(str(project))
    return module.rollout_phase_fingerprints(host_vars, host_vars, toolkit)


def test_each_phase_changes_with_what_it_reads_and_the_phases_before_it(project):
    base = {"sglang_service_hicache_args": {"--hicache-size": 2}, "rocm_version": "7.2.1",
            "models_disk_margin_mb": 2048, "sglang_venv_package_set": "test-minimal"}
    first = phases(project, base)
    assert sorted(first) == ["models", "rocm", "venv"]
    assert len(set(first.values())) == 3
    # The service's config (the HiCache size) is no install phase's input: every phase stays.
    assert phases(project, {**base, "sglang_service_hicache_args": {"--hicache-size": 8}}) == first
    # A models option changes the models phase only; a venv option venv and models; ROCm all three.
    models = phases(project, {**base, "models_disk_margin_mb": 4096})
    assert (models["rocm"], models["venv"]) == (first["rocm"], first["venv"])
    assert models["models"] != first["models"]
    venv = phases(project, {**base, "sglang_venv_package_set": "rocm-gfx1100"})
    assert venv["rocm"] == first["rocm"]
    assert venv["venv"] != first["venv"]
    assert venv["models"] != first["models"]
    rocm = phases(project, {**base, "rocm_version": "7.1.1"})
    assert all(rocm[p] != first[p] for p in first)


def test_a_phase_follows_its_own_roles_files_and_the_shared_toolkit(project):
    base = {"rocm_version": "7.2.1"}
    first = phases(project, base)
    (project / "roles" / "sglang_service" / "tasks" / "main.yml").write_text("---\n[]\n")
    assert phases(project, base) == first
    with (project / "roles" / "models" / "defaults" / "main.yml").open("a") as handle:
        handle.write("# a comment\n")
    models = phases(project, base)
    assert models["venv"] == first["venv"]
    assert models["models"] != first["models"]
    (project / "library" / "fleet_release_state.py").write_text("# another module\n")
    assert all(v != models[k] for k, v in phases(project, base).items())


def test_phase_outputs_are_recorded_only_for_phases_whose_facts_are_all_known():
    module = load("roles/rollout/filter_plugins/rollout_converged.py")
    wanted = {"rocm": ["rocm_release_id"], "venv": ["sglang_venv_target_path", "sglang_venv_target_release"]}
    facts = Templating({"rocm_release_id": "distro-1a2b", "sglang_venv_target_path": "/opt/sglang/releases/x"},
                       failing=set())
    # The venv phase lacks one of its facts: it is not recorded, so the next run runs it.
    assert module.rollout_phase_outputs(facts, wanted) == {"rocm": {"rocm_release_id": "distro-1a2b"}}
    failing = Templating({"rocm_release_id": "x"}, failing={"rocm_release_id"})
    assert module.rollout_phase_outputs(failing, wanted) == {}


def test_the_rocm_phase_reads_only_what_makes_gpus_visible_of_the_services_environment(project):
    """The ROCm phase's GPU check reads the service's environment and instances (rocm_gpu_environment,
    rocm_gpu_instances default to them), but only their GPU masks, names and TP sizes: any other change
    leaves every install phase as it was; a mask or a TP size runs all three again."""
    instances = [{"name": "main", "port": 30000, "environment": {"HIP_VISIBLE_DEVICES": "0,1", "HF_HOME": "/a"},
                  "args": {"--tp-size": 2, "--context-length": 131072}}]
    base = {"rocm_version": "7.2.1", "sglang_service_environment": {"OMP_NUM_THREADS": "8"},
            "sglang_service_instances": instances}
    first = phases(project, base)
    same = [
        {**base, "sglang_service_environment": {"OMP_NUM_THREADS": "16", "SGLANG_LOG_LEVEL": "debug"}},
        {**base, "sglang_service_instances": [{**instances[0], "port": 30001,
                                               "environment": {"HIP_VISIBLE_DEVICES": "0,1", "HF_HOME": "/b"},
                                               "args": {"--tp-size": 2, "--context-length": 65536}}]},
    ]
    for host_vars in same:
        assert phases(project, host_vars) == first, host_vars
    changed = [
        {**base, "sglang_service_environment": {"OMP_NUM_THREADS": "8", "ROCR_VISIBLE_DEVICES": "0"}},
        {**base, "sglang_service_instances": [{**instances[0], "environment": {"HIP_VISIBLE_DEVICES": "1,0"}}]},
        {**base, "sglang_service_instances": [{**instances[0], "args": {"--tp-size": 1}}]},
        {**base, "sglang_service_instances": [{**instances[0], "name": "second"}]},
        {**base, "sglang_service_instances": [*instances, {"name": "b", "environment": {"HIP_VISIBLE_DEVICES": "2"}}]},
    ]
    for host_vars in changed:
        now = phases(project, host_vars)
        assert all(now[p] != first[p] for p in first), host_vars


def test_a_service_environment_that_cannot_be_templated_yet_counts_whole_in_the_rocm_phase(project):
    base = {"rocm_version": "7.2.1", "sglang_service_environment": "{{ lookup('env', 'X') }}"}
    module = load("roles/rollout/filter_plugins/rollout_converged.py")
    toolkit = module.rollout_release_toolkit(str(project))

    def rocm(raw_text: str) -> str:
        raw = {**base, "sglang_service_environment": raw_text}
        return module.rollout_phase_fingerprints(Templating(raw, {"sglang_service_environment"}), raw, toolkit)["rocm"]

    assert rocm("{{ env_a }}") != rocm("{{ env_b }}")


def test_the_gpu_visibility_keys_are_those_the_rocm_gpu_check_reads():
    converged = load("roles/rollout/filter_plugins/rollout_converged.py")
    rocm = load("roles/rocm/filter_plugins/rocm.py")
    assert set(converged.GPU_VISIBILITY_KEYS) == {"HIP_VISIBLE_DEVICES", *rocm._OTHER_MASKS}


def secrets_of(project: Path, host_vars: dict) -> dict:
    module = load("roles/rollout/filter_plugins/rollout_converged.py")
    toolkit = module.rollout_release_toolkit(str(project))
    return module.rollout_release_secrets(host_vars, host_vars, toolkit)


def phases_of(project: Path, host_vars: dict) -> dict:
    module = load("roles/rollout/filter_plugins/rollout_converged.py")
    toolkit = module.rollout_release_toolkit(str(project))
    return module.rollout_phase_fingerprints(host_vars, host_vars, toolkit)


KEYED = {
    "sglang_service_api_key": "k-fleet-FP1",
    "sglang_service_instances": [{"name": "main", "port": 30004, "api_key": "k-own-FP2"}],
    "models_hf_token": "hf_tok-FP3",
    "sglang_venv_index_url": "https://bob:pw-FP4@127.0.0.1:9/idx",
}


def test_no_key_counts_in_a_fingerprint_but_every_key_goes_to_the_hosts_hmac(project):
    """Issue 24: a fingerprint is printed at -v; a plain hash over a key would let a guessed key be
    tested. Another key (fleet, instance, token, a URL's password) leaves every fingerprint as it is;
    the secrets the module HMACs under the host's key change instead, so a rotation is still seen."""
    rotated = {
        "sglang_service_api_key": "k-fleet-ROT1",
        "sglang_service_instances": [{"name": "main", "port": 30004, "api_key": "k-own-ROT2"}],
        "models_hf_token": "hf_tok-ROT3",
        "sglang_venv_index_url": "https://bob:pw-ROT4@127.0.0.1:9/idx",
    }
    assert fingerprint(project, rotated) == fingerprint(project, KEYED)
    assert phases_of(project, rotated) == phases_of(project, KEYED)
    before, after = secrets_of(project, KEYED), secrets_of(project, rotated)
    for secret in ("k-fleet-FP1", "k-own-FP2", "hf_tok-FP3", "pw-FP4"):
        assert secret in before["release"]
    assert after["release"] != before["release"]
    # The models phase reads the token and the venv phase the index URL: their texts change, the
    # ROCm phase's (it reads neither) does not.
    assert after["phases"]["venv"] != before["phases"]["venv"]
    assert after["phases"]["models"] != before["phases"]["models"]
    assert after["phases"]["rocm"] == before["phases"]["rocm"] == ""
    # Still counted: a key that is set against one that is not, and the URL without its credentials.
    assert fingerprint(project, {**KEYED, "sglang_service_api_key": ""}) != fingerprint(project, KEYED)
    other_host = {**KEYED, "sglang_venv_index_url": "https://bob:pw-FP4@127.0.0.4:9/idx"}
    assert fingerprint(project, other_host) != fingerprint(project, KEYED)
    # Without any secret: nothing for the module to add (the records of before stay valid).
    none = {"release": "", "phases": {"rocm": "", "venv": "", "models": ""}}
    assert secrets_of(project, {"rocm_version": "7.2"}) == none


def test_the_fast_paths_summary_puts_each_host_in_its_groups_and_says_why():
    """One task decides the groups for the whole converged play (tasks/converged.yml): from each
    host's drift check, _converged, _current_<phase> per phase its record holds, or none."""
    summary = load("roles/rollout/filter_plugins/rollout_converged.py").rollout_converged_summary
    results = {
        "a": {"converged": True, "reasons": [], "current_phases": ["rocm", "venv", "models"]},
        "b": {"converged": False, "reasons": ["the desired release changed since the last whole run"],
              "current_phases": ["rocm", "venv"]},
        "c": {"converged": False, "reasons": ["sglang-main.service is not active (failed)"], "current_phases": []},
        "d": {"unreachable": True, "msg": "ssh: connect to host d port 22: Connection refused"},
        "e": {"skipped": True, "changed": False},
    }
    hosts = ["a", "b", "c", "d", "e", "f"]
    done = summary(hosts, results, False)
    assert done["groups"] == {"a": ["_converged"], "b": ["_current_rocm", "_current_venv"]}
    assert done["lines"] == [
        "a: converged: its recorded release is the desired one and nothing drifted; every phase is skipped",
        "b: runs every phase but rocm, venv (current): the desired release changed since the last whole run",
        "c: runs every phase: sglang-main.service is not active (failed)",
        "d: unreachable: ssh: connect to host d port 22: Connection refused",
        "e: the fast path is off (rollout_fast_path is false or rollout_probe_always is true for this host)",
        "f: the fast path is off (rollout_fast_path is false or rollout_probe_always is true for this host)",
    ]
    tagged = summary(["e"], {"e": {"skipped": True}}, True)
    assert tagged == {"groups": {}, "lines": ["e: the fast path is off (--tags or --skip-tags given)"]}
    # playbooks/rollout.yml run alone has no install phase: a host that is not converged goes through
    # its rollout, whatever install phases its record still holds.
    alone = summary(["a", "b", "c"], results, False, "rollout.yml")
    assert alone["groups"] == done["groups"]
    assert alone["lines"] == [
        done["lines"][0],
        "b: goes through the rollout (rollout.yml alone): the desired release changed since the last whole run",
        "c: goes through the rollout (rollout.yml alone): sglang-main.service is not active (failed)",
    ]


def test_the_split_roles_options_count_but_an_entry_points_call_inputs_do_not(project):
    """The rollout is three roles: an option the gate (rollout_gate) or the router membership
    (rollout_router) declares is part of a host's release; the instances one call of rollout_router's
    leave/join names (set per call by the gate, the A/B, the sizing sweep) are not, nor the inputs of
    one call of sglang_service's ab, snapshot and probe_progress."""
    base = {"rollout_router_url": "http://10.0.0.5:30000", "rollout_probe_repeats": 2}
    before = fingerprint(project, base)
    assert fingerprint(project, dict(base, rollout_probe_repeats=3)) != before
    assert fingerprint(project, dict(base, rollout_router_url="http://10.0.0.6:30000")) != before
    assert fingerprint(project, dict(base, rollout_router_leaving=["main"], rollout_router_names=["main"])) == before
    # The inputs of one call of sglang_service's ab (the A/B) and probe_progress neither.
    call = {"sglang_service_ab_instance": {"name": "main", "port": 30004}, "sglang_service_ab_probe": {"url": "http://x"},
            "sglang_service_probe_progress": {"round": 1}, "sglang_service_snapshot_instance": "main"}
    assert fingerprint(project, dict(base, **call)) == before
