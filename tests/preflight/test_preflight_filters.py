"""The preflight role's checks as plain functions (roles/preflight/filter_plugins/preflight.py).

Each check returns findings that name the variable and the fix; the SGLang argv check works from
the flag table read off SGLang 0.5.23's own argparse parser (roles/sglang_service/files/sglang-flags.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jinja_old import expr, render
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
pf = load("roles/preflight/filter_plugins/preflight.py", "preflight_filters")
sc = load("roles/sglang_service/filter_plugins/sglang_service_checks.py", "sglang_service_checks")
TABLE = json.loads((ROOT / "roles/sglang_service/files/sglang-flags.json").read_text())
SEED = [
    "--model-path", "/srv/models/main", "--served-model-name", "m", "--host", "127.0.0.1", "--port", "30004",
    "--tp-size", "2", "--quantization", "gptq", "--dtype", "bfloat16", "--mamba-ssm-dtype", "bfloat16",
    "--kv-cache-dtype", "bfloat16", "--attention-backend", "triton", "--context-length", "196608",
    "--mem-fraction-static", "0.80", "--max-running-requests", "3", "--max-mamba-cache-size", "20",
    "--chunked-prefill-size", "2048", "--enable-mixed-chunk", "--cuda-graph-bs-decode", "1", "2", "4",
    "--triton-attention-num-kv-splits", "16", "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen3_coder",
    "--enable-cache-report", "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/d",
    "--speculative-draft-model-quantization", "compressed-tensors", "--speculative-num-draft-tokens", "8",
    "--speculative-draft-window-size", "2048", "--stream-interval", "1", "--enable-hierarchical-cache",
    "--hicache-size", "12", "--hicache-ratio", "2.0", "--hicache-io-backend", "kernel",
    "--hicache-host-memory-mode", "cache", "--hicache-write-policy", "write_through", "--config", "/etc/x.yaml",
]


def test_the_table_is_sglangs_own():
    assert TABLE["sglang_version"] == "0.5.23"
    assert "argparse" in TABLE["source"]
    assert TABLE["flags"]["--hicache-size"]["kind"] == "int"
    assert TABLE["flags"]["--enable-hierarchical-cache"]["kind"] == "switch"
    assert TABLE["flags"]["--enable-hicache"]["dest"] == "enable_hierarchical_cache"  # the alias
    assert "kernel" in TABLE["flags"]["--hicache-io-backend"]["choices"]


def test_the_seed_command_line_passes():
    assert sc.sglang_argv(SEED, TABLE) == []


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag"),
        (["--cuda-graph-bs", "1"], "ambiguous option: --cuda-graph-bs could match --cuda-graph-bs-decode, "
                                   "--cuda-graph-bs-prefill"),
        (["--hicache-size", "0.5"], "argument --hicache-size: invalid int value: '0.5'"),
        (["--hicache-ratio", "x"], "argument --hicache-ratio: invalid float value: 'x'"),
        (["--hicache-io-backend", "dma"], "argument --hicache-io-backend: invalid choice: 'dma'"),
        (["--hicache-ratio", "-1"], "argument --hicache-ratio: -1.0 is out of range (must be > 0)"),
        (["--mem-fraction-static", "1.2"], "argument --mem-fraction-static: 1.2 is out of range (must be < 1)"),
        (["--tp-size", "0"], "argument --tp-size: 0 is out of range (must be >= 1)"),
        (["--port", "70000"], "argument --port: 70000 is out of range (must be <= 65535)"),
        (["--tp-size"], "argument --tp-size: expected one argument"),
        (["--tp-size", "2", "3"], "unrecognized arguments: 3"),
        (["--enable-cache-report=yes"], "argument --enable-cache-report: ignored explicit argument 'yes'"),
        (["--cuda-graph-bs-decode"], "argument --cuda-graph-bs-decode: expected at least one argument"),
    ],
)
def test_argv_errors_in_argparses_words(argv, error):
    errors = sc.sglang_argv(["--model-path", "/m", *argv], TABLE)
    assert any(found.startswith(error) for found in errors), errors


def test_unique_prefix_and_inline_values_are_accepted():
    assert sc.sglang_argv(["--model-path=/m", "--hicache-si", "2", "--tp=2"], TABLE) == []


def test_custom_ranges_add_to_the_defaults_never_replace_them():
    # Issue 24: sglang_service_flag_ranges could switch the built-in ranges off; now both apply.
    assert sc.sglang_argv(["--tp-size", "0"], TABLE, {}) == ["argument --tp-size: 0 is out of range (must be >= 1)"]
    assert sc.sglang_argv(["--tp-size", "9"], TABLE, {"--tp-size": {"max": 8}}) == [
        "argument --tp-size: 9 is out of range (must be <= 8)"
    ]


def _plan(**overrides):
    args = {"--model-path": "/m", "--tp-size": 2, "--context-length": 196608, "--port": 30004,
            "--host": "127.0.0.1"}
    entry = {"name": "main", "unit": "sglang-main.service", "port": 30004, "bind": "127.0.0.1",
             "profile": "seed-validated", "profile_known": True, "profile_hicache_flags": [], "hicache": True,
             "api_key_set": False, "args": args}
    entry.update(overrides)
    entry["argv"] = [str(w) for k, v in entry["args"].items() for w in ([k] if v is True else [k, v])]
    return entry


SETTINGS = {"profiles": ["seed-validated"], "draft_free_algorithms": ["NGRAM"], "environment": {},
            "gpus": None,
            # The rollout's probe (preflight_probe_findings; the service's checks ignore it).
            "probe": {"rollout_probe_input_len_canary": 128000, "rollout_probe_input_len": 32000,
                                    "output_len": 512}}


def findings(plan, instances=(), **settings):
    return sc.config_findings(plan, list(instances), TABLE, {**SETTINGS, **settings})


def test_a_good_plan_has_no_findings():
    assert findings([_plan()], [{"name": "main", "environment": {"HIP_VISIBLE_DEVICES": "0,1"}}]) == []


def test_names_ports_and_bind():
    plan = [_plan(), _plan(name="main", port=30004, unit="sglang-main.service"), _plan(name="Bad Name", port=0)]
    text = " | ".join(findings(plan))
    assert "the name 'main' is used twice" in text
    assert "the name 'Bad Name' is not valid" in text
    assert "port 30004 is given to main, main" in text
    assert "port 0 is out of range" in text
    assert "binds 10.0.0.5, which is not a loopback address, without an api key" in " ".join(
        findings([_plan(bind="10.0.0.5")]))
    assert findings([_plan(bind="10.0.0.5", api_key_set=True)]) == []
    assert findings([_plan(bind="::1")]) == []


def test_profiles_hicache_and_speculative():
    assert "profile 'x' is not in sglang_service_profiles" in findings([_plan(profile="x", profile_known=False)])[0]
    assert "carries HiCache flags" in findings([_plan(profile_hicache_flags=["--hicache-size"])])[0]
    buffer = _plan(args={"--model-path": "/m", "--hicache-host-memory-mode": "buffer_only"})
    assert "requires a storage backend" in findings([buffer])[0]
    spec = _plan(args={"--model-path": "/m", "--speculative-algorithm": "DFLASH"})
    assert "needs --speculative-draft-model-path" in findings([spec])[0]
    assert findings([_plan(args={"--model-path": "/m", "--speculative-algorithm": "NGRAM"})]) == []
    assert findings([spec], draft_from_models=True) == []  # the models role provides it later


def test_tp_size_against_visible_devices_and_gpus_found():
    one = [{"name": "main", "environment": {"HIP_VISIBLE_DEVICES": "0"}}]
    assert "--tp-size 2 needs 2 GPUs but HIP_VISIBLE_DEVICES=0 shows 1" in findings([_plan()], one)[0]
    assert "rocminfo found 1" in findings([_plan()], gpus=1)[0]
    # The fleet's environment counts when the instance sets none.
    assert findings([_plan()], environment={"HIP_VISIBLE_DEVICES": "0,1"}) == []


def test_probe_prompt_longer_than_the_context():
    probe = {**SETTINGS["probe"], "rollout_probe_input_len_canary": 300000}
    assert pf.probe_findings([_plan()], SETTINGS["probe"]) == []
    text = pf.probe_findings([_plan()], probe)
    assert text == [
        "sglang-main.service: rollout_probe_input_len_canary = 300000 (+ rollout_probe_cold_output_len 512) is longer "
        "than its --context-length 196608; lower rollout_probe_input_len_canary or raise --context-length."
    ]
    # An instance whose profile is unknown is not checked against a context it does not have.
    assert pf.probe_findings([_plan(profile_known=False)], probe) == []


def test_rollout_settings():
    good = {"batches": [1, "25%", "100%"], "probe": {"rollout_probe_repeats": 3}, "package_set": "a",
            "package_sets": {"a": {}}}
    assert pf.rollout_findings(good) == []
    bad = pf.rollout_findings({**good, "batches": [], "probe": {"rollout_probe_repeats": 0}, "package_set": "b"})
    assert len(bad) == 3
    assert "rollout_batches = [] is not a non-empty list" in bad[0]
    assert "rollout_probe_repeats = 0 is not a positive number" in bad[1]
    assert "sglang_venv_package_set = 'b' is not in sglang_venv_package_sets (known: a)" in bad[2]
    assert "'150%' is not a batch size" in pf.rollout_findings({**good, "batches": [1, "150%", 0]})[0]


def test_ram_one_implementation_for_both_inputs():
    pools = [{"host_pool_gb": 24, "host_pool_label": "main: 2 x 12 GB", "variable": "v"}]
    assert sc.ram_findings(pools, 64 * 1024, 16, "h") == []
    [message] = sc.ram_findings(pools, 32 * 1024, 16, "h")
    assert "they need 24 GB of pinned RAM (main: 2 x 12 GB;" in message
    assert "sglang_service_memory_reserve_gb = 16 GB, but h has 34.4 GB" in message
    assert "Lower v" in message
    assert sc.ram_findings([], 1, 16) == []


def test_host_findings():
    facts = {"distribution": "Debian", "distribution_version": "12.15", "distribution_major_version": "12",
             "service_mgr": "systemd", "python_version": "3.11.2"}
    settings = {"supported_os": {"Debian": ["12"]}, "min_python": "3.11", "gpu_arch": "gfx1100",
                "expected_gpus": 2, "rocminfo": None}
    assert pf.host_findings(facts, settings) == []
    bad = pf.host_findings({**facts, "service_mgr": "sysvinit", "python_version": "3.9.1"},
                           {**settings, "supported_os": {"Ubuntu": ["24.04"]}, "rocminfo": "  Name: gfx1100\n"})
    assert [f.split(" ")[0] for f in bad] == ["unsupported", "init", "Python", "rocminfo"]
    assert pf.gpus_found("  Name:   gfx1100\n  Name: gfx1100 \n Name: gfx90a", "gfx1100") == 2
    assert pf.gpus_found(None, "gfx1100") is None


def test_ports_and_argument_specs_and_summary():
    taken = {"rc": 1, "item": {"unit": "u", "port": 22, "bind": "127.0.0.1"},
             "stdout": json.dumps({"conflicts": [{"listen": "127.0.0.1:22", "processes": ["sshd (pid 5)"]}]})}
    assert sc.port_findings([taken, {"rc": 0}, {"skipped": True}]) == [
        "u: port 22 on 127.0.0.1 is taken by sshd (pid 5) listening on 127.0.0.1:22; choose another `port` for "
        "this instance in sglang_service_instances or stop that process."]
    passed = {"changed": False, "msg": "The arg spec validation passed"}
    checks = {"preflight": passed, "rocm": passed,
              "rollout": {"failed": True, "msg": "Validation of arguments failed",
                          "argument_errors": ["argument 'x' is bad"]}}
    specs = pf.argument_spec_findings(checks, ["preflight", "rocm", "rollout"])
    assert specs == ["argument 'x' is bad (roles/rollout/meta/argument_specs.yml); fix that variable in the "
                     "inventory or -e."]
    # Only the roles asked for, in their order; a role asked for that published nothing is not passed.
    assert pf.argument_spec_findings(checks, ["preflight", "rocm"]) == []
    skipped = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}
    assert pf.argument_spec_findings(dict(checks, models=None, rocm=skipped), ["rocm", "models"])[1:] == [
        "the models role's variables were not checked against roles/models/meta/argument_specs.yml: its entry point "
        "argument_check published no models_argument_check; restore roles/models/tasks/argument_check.yml (a fault "
        "of the toolkit, not of the inventory)."]
    assert pf.argument_spec_findings(dict(checks, rocm=skipped), ["rocm"])[0].startswith(
        "the rocm role's variables were not checked against roles/rocm/meta/argument_specs.yml")
    # A check that stopped before it validated (a value that does not render) is not a pass either.
    broken = {"failed": True, "msg": "'nope' is undefined"}
    assert pf.argument_spec_findings({"rocm": broken}, ["rocm"]) == [
        "the rocm role's variables could not be checked against roles/rocm/meta/argument_specs.yml: 'nope' is "
        "undefined; fix the value it names in the inventory or -e."]
    assert pf.summary(["a", "b  c"], "h", "nothing changed") == (
        "preflight found 2 problem(s) on h; nothing changed:\n  1. a\n  2. b c")


# --- the filters that replaced inline ternaries in tasks/main.yml and service.yml ------------------

ROCMINFO_RUNS = [
    {"skipped": True, "skip_reason": "Conditional result was False"},
    {"rc": 0, "stdout": "Agent 2\n  Name: gfx1100\n", "stderr": ""},
    {"rc": 1, "stdout": "", "stderr": "HSA_STATUS_ERROR_OUT_OF_RESOURCES"},
    {"rc": 0},
]


@pytest.mark.parametrize("result", ROCMINFO_RUNS)
@pytest.mark.parametrize("expected", [0, 2])
def test_rocminfo_and_gpus_counted(result, expected):
    old_short = expr("none if r is skipped else (r.stdout | default(''))", r=result)
    old_long = expr("none if r is skipped else (r.stdout | default('')) ~ ' ' ~ (r.stderr | default(''))", r=result)
    assert pf.rocminfo(result) == old_short
    assert pf.rocminfo(result, stderr=True) == old_long
    old = expr("(i | preflight_gpus_found(arch)) if (i is not none and n | int > 0) else none",
               filters={"preflight_gpus_found": pf.gpus_found}, i=old_long, arch="gfx1100", n=expected)
    assert pf.gpus_counted(pf.rocminfo(result, stderr=True), "gfx1100", expected) == old


@pytest.mark.parametrize("needed", [True, False])
def test_bytes_needed(needed):
    old = expr("((gb | int) * 1000000000) if needed | bool else 0", gb=30, needed=needed)
    assert pf.bytes_needed(30, needed) == old


@pytest.mark.parametrize("ranges", [{}, {"--mem-fraction-static": {"min": 0.1}}])
def test_ranges_or_none(ranges):
    assert expr("r or none", r=ranges) == expr("r if r | length > 0 else none", r=ranges)


@pytest.mark.parametrize("check_service", [True, False])
def test_verdict_message_reads_as_before(check_service):
    names = {"check": check_service, "plan": [{}, {}]}
    old = render("RAM{{ (', ' ~ plan | length ~ ' SGLang instance(s) checked') if check | bool else '' }}.", **names)
    new = render("RAM{% if check | bool %}, {{ plan | length }} SGLang instance(s) checked{% endif %}.", **names)
    assert new == old


def test_a_renamed_variable_set_in_an_inventory_is_a_finding_naming_the_new_name():
    assert pf.renamed_findings(["preflight_expected_gpus", "preflight_rocm_dir"]) == []
    found = pf.renamed_findings(["preflight_sglang_ranges", "preflight_memory_reserve_gb", "preflight_rocm_dir"])
    assert found == [
        "preflight_memory_reserve_gb is set but no longer read: the sglang_service role owns this setting now as "
        "sglang_service_memory_reserve_gb. Rename it to sglang_service_memory_reserve_gb in the inventory.",
        "preflight_sglang_ranges is set but no longer read: the sglang_service role owns this setting now as "
        "sglang_service_flag_ranges. Rename it to sglang_service_flag_ranges in the inventory.",
    ]
    # Each new name is a default of the sglang_service role, so the rename lands on a variable it reads.
    import yaml

    defaults = yaml.safe_load((ROOT / "roles/sglang_service/defaults/main.yml").read_text())
    assert set(pf.RENAMED.values()) <= set(defaults)


def test_the_service_findings_message_numbers_each_finding():
    message = sc.findings_message(["a\n b", "", "c"], "h1", "nothing was installed")
    assert message == "the sglang_service config has 2 problem(s) on h1; nothing was installed:\n  1. a b\n  2. c"
