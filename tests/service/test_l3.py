"""The L3 tier (issue 27, item 1): SGLang's `file` storage backend bound to the cache identity.

- the identity (filter): each part a page depends on changes it, the defaults SGLang 0.5.23 resolves
  when a flag is absent give the same identity as naming them, nothing else changes it;
- the plan rendered by Ansible: `--hicache-storage-backend file`, the env SGLang's file backend reads
  (directory <l3_dir>/<name>/<id>, size limit in bytes, eviction ratio), the directory among the unit's
  ReadWritePaths, the identity in release.json; nothing of it with the tier off or HiCache off;
- the directories (owner, mode) and which ones prune removes.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
from plugins import load
from service_render import run_plans

F = load("roles/sglang_service/filter_plugins/sglang_service.py")
# What prune keeps and removes: library/sglang_service_release.py's rules (state prune).
R = load("module_utils/sglang_service_release.py")

ARGS = {"--model-path": "/srv/models/.store/main-0123456789ab",
        "--speculative-draft-model-path": "/srv/models/.store/draft-ba9876543210",
        "--tp-size": 2, "--kv-cache-dtype": "bfloat16", "--dtype": "bfloat16",
        "--enable-hierarchical-cache": True, "--hicache-io-backend": "kernel",
        "--context-length": 131072, "--host": "127.0.0.1", "--port": 30004}
RELEASE = "0.5.23-test-minimal-aff28f5bd3a5"


def test_identity_names_what_the_pages_depend_on():
    identity = F.l3_identity(ARGS, RELEASE)
    assert identity == {**identity, "model": ARGS["--model-path"], "draft": ARGS["--speculative-draft-model-path"],
                        "sglang": RELEASE, "dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "page_size": 1,
                        "tp_size": 2, "pp_size": 1, "mem_layout": "page_first"}
    assert re.fullmatch(r"[0-9a-f]{16}", identity["id"])


@pytest.mark.parametrize("change", [
    {"--model-path": "/srv/models/.store/main-ffffffffffff"},
    {"--speculative-draft-model-path": "/srv/models/.store/draft-ffffffffffff"},
    {"--kv-cache-dtype": "fp8_e4m3"},
    {"--dtype": "float16"},
    {"--page-size": 16},
    {"--tp-size": 1},
    {"--pp-size": 2},
    {"--hicache-mem-layout": "layer_first"},
    {"--hicache-io-backend": "direct"},  # page_first resolves to page_first_direct with direct io
])
def test_each_part_changes_the_identity(change):
    assert F.l3_identity({**ARGS, **change}, RELEASE)["id"] != F.l3_identity(ARGS, RELEASE)["id"]


def test_sglang_release_changes_the_identity():
    assert F.l3_identity(ARGS, "0.5.24-test-minimal-000000000000")["id"] != F.l3_identity(ARGS, RELEASE)["id"]


def test_absent_flags_are_sglangs_defaults_and_other_flags_do_not_count():
    bare = {"--model-path": "/m"}
    named = {"--model-path": "/m", "--dtype": "auto", "--kv-cache-dtype": "auto", "--page-size": 1,
             "--tensor-parallel-size": 1, "--hicache-mem-layout": "page_first", "--hicache-io-backend": "kernel"}
    assert F.l3_identity(bare, RELEASE)["id"] == F.l3_identity(named, RELEASE)["id"]
    assert F.l3_identity(bare, RELEASE)["mem_layout"] == "page_first"
    assert F.l3_identity({**bare, "--hicache-io-backend": "direct"}, RELEASE)["mem_layout"] == "page_first_direct"
    # The context length, the port, HiCache sizes: not what a page's bytes depend on.
    assert (F.l3_identity({**ARGS, "--context-length": 4096, "--port": 1, "--hicache-size": 99}, RELEASE)["id"]
            == F.l3_identity(ARGS, RELEASE)["id"])


def test_l3_args_put_the_backend_before_host_only_when_on():
    on = F.l3_args(ARGS, True)
    keys = list(on)
    assert on["--hicache-storage-backend"] == "file"
    assert keys.index("--hicache-storage-backend") == keys.index("--host") - 1
    assert F.l3_args(ARGS, False) == ARGS
    assert "--hicache-storage-backend" not in F.l3_args(ARGS, False)
    # An explicit backend stays (preflight refuses one other than file).
    assert F.l3_args({**ARGS, "--hicache-storage-backend": "nixl"}, True)["--hicache-storage-backend"] == "nixl"


def test_directories_and_prune():
    plan = [{"name": "a", "l3": {"root": "/var/lib/sglang/l3", "dir": "/var/lib/sglang/l3/a/0123456789abcdef"}},
            {"name": "b", "l3": {}}]
    assert F.l3_directories(plan, "sglang", "sglang") == [
        {"path": "/var/lib/sglang/l3", "owner": "root", "group": "root", "mode": "0755"},
        {"path": "/var/lib/sglang/l3/a", "owner": "root", "group": "root", "mode": "0755"},
        {"path": "/var/lib/sglang/l3/a/0123456789abcdef", "owner": "sglang", "group": "sglang", "mode": "0700"},
    ]
    found = [{"path": "/var/lib/sglang/l3/a/" + name} for name in ("0123456789abcdef", "1111111111111111",
                                                                   "2222222222222222")]
    kept = [{"name": "a", "l3": {"dir": "/var/lib/sglang/l3/a/1111111111111111"}}, {"name": "a"}, {}]
    assert R.prune_l3(found, [*kept, plan[0]["l3"]]) == ["/var/lib/sglang/l3/a/2222222222222222"]
    assert R.prune_l3(found, []) == [entry["path"] for entry in found]


def test_only_the_running_release_keeps_its_l3_directory():
    releases = [
        {"release_dir": "/var/lib/sglang/main/releases/aaaaaaaaaaaa", "config_hash": "aaaaaaaaaaaa" + "0" * 52,
         "l3": {"dir": "/l3/main/1111"}},  # current
        {"release_dir": "/var/lib/sglang/main/releases/bbbbbbbbbbbb", "config_hash": "bbbbbbbbbbbb" + "0" * 52,
         "l3": {"dir": "/l3/main/2222"}},  # previous, not validated
        {"release_dir": "/var/lib/sglang/main/releases/cccccccccccc", "config_hash": "cccccccccccc" + "0" * 52,
         "l3": {"dir": "/l3/main/3333"}},  # validated before this run's release
    ]
    kept = R.l3_kept(releases, ["/var/lib/sglang/main/releases/aaaaaaaaaaaa/"])
    assert [r["l3"]["dir"] for r in kept] == ["/l3/main/1111"]
    found = [{"path": f"/l3/main/{n}"} for n in ("1111", "2222", "3333")]
    assert R.prune_l3(found, kept) == ["/l3/main/2222", "/l3/main/3333"]
    # Nothing running (prune called alone before any activation): only the plan's stays.
    assert R.l3_kept(releases, []) == []


def test_release_record_carries_the_identity_only_when_on():
    instance = {"name": "a", "args": ARGS, "l3": {"id": "0123456789abcdef", "dir": "/x/a/0123456789abcdef"}}
    assert F.release_record(instance, "/opt/sglang/venvs/r/bin/python")["l3"]["id"] == "0123456789abcdef"
    assert "l3" not in F.release_record({**instance, "l3": {}}, "/opt/sglang/venvs/r/bin/python")


def _exec_start(unit: str) -> list[str]:
    text = unit.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0]
    return shlex.split(text.replace("\\\n", " "))


def _env(unit: str) -> dict[str, str]:
    return dict(line.split("=", 2)[1:] for line in unit.splitlines() if line.startswith("Environment=SGLANG_HICACHE"))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    work = tmp_path_factory.mktemp("l3")
    base = {"sglang_service_profile": "seed-baseline", "sglang_venv_target_release": RELEASE,
            "sglang_service_instances": [{"name": "main", "port": 30010}]}
    cases = {
        "on": {**base, "sglang_service_l3_enabled": True, "sglang_service_l3_max_size_gb": 50,
               "sglang_service_l3_dir": "/srv/l3/"},
        "kv8": {**base, "sglang_service_l3_enabled": True, "sglang_service_l3_max_size_gb": 2.5,
                "sglang_service_args": {"--kv-cache-dtype": "fp8_e4m3"}},
        "off": base,
        "nohicache": {**base, "sglang_service_l3_enabled": True, "sglang_service_l3_max_size_gb": 50,
                      "sglang_service_hicache_enabled": False},
        "instance": {**base, "sglang_service_l3_max_size_gb": 50,
                     "sglang_service_instances": [{"name": "main", "port": 30010, "l3_enabled": True},
                                                  {"name": "two", "port": 30011}]},
    }
    outs = {name: work / name for name in cases}
    for out in outs.values():
        out.mkdir()
    run_plans(work, {name: (outs[name], extra) for name, extra in cases.items()})
    return {name: ({p["name"]: p for p in json.loads((out / "plan.json").read_text())},
                   {p.name: p.read_text() for p in out.glob("*.service")}) for name, out in outs.items()}


def test_on_renders_the_file_backend_in_the_identity_directory(rendered):
    plan, units = rendered["on"]
    main, unit = plan["main"], units["sglang-main.service"]
    argv = _exec_start(unit)
    assert argv[argv.index("--hicache-storage-backend") + 1] == "file"
    identity = F.l3_identity(main["args"], RELEASE)
    assert main["l3"]["id"] == identity["id"]
    directory = f"/srv/l3/main/{identity['id']}"
    assert _env(unit) == {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": directory,
                          "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "50000000000",
                          "SGLANG_HICACHE_FILE_BACKEND_EVICTION_RATIO": "0.9"}
    rw = next(line for line in unit.splitlines() if line.startswith("ReadWritePaths="))
    assert directory in rw.split("=", 1)[1].split()
    record = json.loads(F.release_instances([main], "/opt/sglang/venvs/r/bin/python")[0]["release_json"])
    assert record["l3"]["dir"] == directory
    assert record["l3"]["kv_cache_dtype"] == "bfloat16"


def test_another_kv_dtype_gets_another_directory(rendered):
    on, kv8 = rendered["on"][0]["main"]["l3"], rendered["kv8"][0]["main"]["l3"]
    assert kv8["id"] != on["id"]
    assert kv8["kv_cache_dtype"] == "fp8_e4m3"
    assert kv8["dir"] == f"/var/lib/sglang/l3/main/{kv8['id']}"
    assert _env(rendered["kv8"][1]["sglang-main.service"])["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"] == "2500000000"


@pytest.mark.parametrize("case", ["off", "nohicache"])
def test_off_or_without_hicache_renders_no_tier(rendered, case):
    plan, units = rendered[case]
    assert plan["main"]["l3"] == {}
    unit = units["sglang-main.service"]
    assert "--hicache-storage-backend" not in _exec_start(unit)
    assert _env(unit) == {}
    assert "/l3" not in next(line for line in unit.splitlines() if line.startswith("ReadWritePaths="))
    assert plan["main"]["l3_requested"] is (case == "nohicache")


def test_the_instance_key_turns_it_on_for_that_instance_only(rendered):
    plan, units = rendered["instance"]
    assert plan["main"]["l3"]["dir"].startswith("/var/lib/sglang/l3/main/")
    assert plan["two"]["l3"] == {}
    assert "--hicache-storage-backend" not in _exec_start(units["sglang-two.service"])


def test_a_release_record_gives_the_directories_a_rollback_makes():
    l3 = {"id": "0123456789abcdef", "root": "/srv/l3", "dir": "/srv/l3/a/0123456789abcdef"}
    record = json.loads(json.dumps(F.release_record({"name": "a", "args": ARGS, "l3": l3}, "/opt/v/r/bin/python")))
    assert F.l3_directories([record, {"name": "old"}], "sglang", "sglang")[-1] == {
        "path": "/srv/l3/a/0123456789abcdef", "owner": "sglang", "group": "sglang", "mode": "0700"}
