"""Issue 24: every input has a type, a range and a charset, checked by preflight before any host changes.

One representative of each class of bad input goes through the REAL playbooks/preflight.yml on
localhost and through the filter (roles/preflight/filter_plugins/preflight_inputs.py) directly: each
must be refused, naming its variable, and the key must not be shown; a good config, and the values of
the shipped inventories (demo, example), pass.

One run of the playbook serves the classes whose plan renders and the good config: two inventory
hosts, both this machine (connection local), each with its own host variables (`bad`: every class
whose plan still renders; `good`: the good config); each host's findings are read from its own
failure in the output. The classes whose value breaks the plan's rendering run on their own: with
ansible-core 2.19, when one host fails inside the plan's include_role, the other hosts of the run go
through the rescue too and fail there on an undefined ansible_failed_result. The shipped
inventories bring their own group_vars, so each runs on its own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
pi = load("roles/preflight/filter_plugins/preflight_inputs.py", "preflight_inputs")
sc = load("roles/sglang_service/filter_plugins/sglang_service_checks.py", "sglang_service_checks")
pf = load("roles/preflight/filter_plugins/preflight.py", "preflight_filters_inputs")
KEY = "s3cr3t-Key-4242"
INJECT = "\nExecStartPre=+/bin/sh -c id"

BASE = {
    "sglang_service_model_path": "/srv/models/main",
    "sglang_service_draft_model_path": "/srv/models/draft",
    "sglang_service_hicache_enabled": False,
    "preflight_kernel_accept_unlisted": True,
    # A port nothing here listens on (the check reads who holds it on this machine).
    "sglang_service_instances": [{"name": "main", "port": 30987}],
    # No models here (the models in preflight: tests/preflight/test_preflight_models.py).
    "preflight_check_models": False,
}

# (class, extra vars, the variable the finding must name). One run of the real playbook takes them all.
BAD = [
    ("newline in a device spec", {"sglang_service_device_allow": ["/dev/kfd rw" + INJECT]},
     "sglang_service_device_allow[0]"),
    ("newline in the profile name", {"sglang_service_profile": "seed-validated" + INJECT}, "sglang_service_profile"),
    ("newline in the syscall filter", {"sglang_service_system_call_filter": ["@system-service" + INJECT]},
     "sglang_service_system_call_filter[0]"),
    ("IPAddressAllow any", {"sglang_service_ip_address_allow": ["any"]}, "sglang_service_ip_address_allow[0]"),
    ("a /0 bind prefix", {"sglang_service_ip_address_bind_prefix": 0}, "sglang_service_ip_address_bind_prefix"),
    ("unit_extra sets User=", {"sglang_service_unit_extra": ["User=root"]}, "sglang_service_unit_extra[0]"),
    ("read_write_paths /", {"sglang_service_read_write_paths": ["/"]}, "sglang_service_read_write_paths[0]"),
    ("supplementary group shadow", {"sglang_service_supplementary_groups": ["render", "video", "shadow"]},
     "sglang_service_supplementary_groups[2]"),
    ("the service user is root", {"sglang_service_user": "root"}, "sglang_service_user = 'root' is root"),
    ("the service group is an existing one", {"sglang_service_group": "daemon"}, "sglang_service_group = 'daemon'"),
    ("--api-key in an instance's args", {"_args": {"--api-key": "x"}},
     "sglang_service_instances[0].args sets --api-key"),
    ("a key with a trailing newline", {"sglang_service_api_key": KEY + "\n"}, "sglang_service_api_key contains"),
    ("a boolean that is none", {"rollout_probe_use_baseline": "flase"}, "rollout_probe_use_baseline"),
    ("a cached fraction of 1.5", {"rollout_probe_min_cached_fraction": 1.5}, "rollout_probe_min_cached_fraction"),
    ("a warm/cold ratio of 50", {"rollout_probe_max_warm_cold_ratio": 50}, "rollout_probe_max_warm_cold_ratio"),
    ("a huge repeat count", {"rollout_probe_repeats": 100000}, "rollout_probe_repeats"),
    ("a negative memory reserve", {"sglang_service_memory_reserve_gb": -100}, "sglang_service_memory_reserve_gb"),
    ("ranges that would replace the defaults",
     {"sglang_service_flag_ranges": {"--mem-fraction-static": {"gt": -1}}, "_args": {"--mem-fraction-static": "1.5"}},
     "argument --mem-fraction-static: 1.5 is out of range"),
    ("a plain-http ROCm key", {"rocm_amd_key_url": "http://repo.invalid/rocm.gpg.key"}, "rocm_amd_key_url"),
    ("a MemoryMax with a line break", {"sglang_service_memory_max": "90%" + INJECT}, "sglang_service_memory_max"),
    ("a TasksMax that is not a number", {"sglang_service_tasks_max": "lots"}, "sglang_service_tasks_max"),
    ("an instance name with a trailing newline", {"_second": {"name": "two\n", "port": 30988}},
     "sglang_service_instances[1]['name'] contains a control character"),
]


def _extra(rows) -> dict:
    extra = dict(BASE, ansible_python_interpreter=sys.executable)
    instance = dict(BASE["sglang_service_instances"][0])
    second = None
    for _, values, _ in rows:
        for key, value in values.items():
            if key == "_args":
                instance.setdefault("args", {}).update(value)
            elif key == "_second":
                second = value
            else:
                extra[key] = value
    extra["sglang_service_instances"] = [instance] + ([second] if second else [])
    return extra


def _run(tmp_path: Path, extra: dict, inventory: str | None = None, limit: str | None = None):
    if inventory is None:
        inventory = str(tmp_path / "hosts.yml")
        Path(inventory).write_text(
            "sglang_hosts:\n  hosts:\n    localhost:\n      ansible_connection: local\n", encoding="utf-8"
        )
    (tmp_path / "extra.json").write_text(json.dumps(extra), encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FACT_CACHING="memory",
               ANSIBLE_NOCOLOR="1")
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", inventory,
            str(ROOT / "playbooks/preflight.yml"), "-e", "@" + str(tmp_path / "extra.json")]
    argv += ["--limit", limit] if limit else []
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)


def _findings(stdout: str) -> list[str]:
    block = stdout.split("msg: |-", 1)[-1]
    return re.findall(r"(?m)^\s+\d+\. (.*)$", block)


# Findings of this machine, not of the config (a container without systemd as PID 1, its OS, its RAM).
HOST_ONLY = re.compile(
    r"init is |unsupported OS |Python .* is older|not enough RAM|SGLang would refuse the HiCache host pools|"
    r"MemAvailable|has [0-9.]+ GB free|the filesystem at |port [0-9]+ on .* is taken|rocminfo|running kernel|"
    r"Secure Boot|of this host's RAM \(.* is smaller than the HiCache host pool"
)


def _renders(row) -> bool:
    """False for the rows run apart: a plan that does not render, or an unknown profile (which leaves its
    instance's argv unchecked, and the ranges row needs it checked)."""
    return "_second" not in row[1] and "sglang_service_profile" not in row[1]


def _bad_vars() -> dict:
    """Every class whose plan still renders (so the plan's own checks run beside the inputs')."""
    return _extra([row for row in BAD if _renders(row)])


def _good_vars() -> dict:
    return dict(BASE, ansible_python_interpreter=sys.executable)


def _pool_vars() -> dict:
    """HiCache on (the role's 2 x 12 GB host pool) under a MemoryMax of 1G: refused from the plan's pool."""
    return dict(BASE, ansible_python_interpreter=sys.executable, sglang_service_hicache_enabled=True,
                sglang_service_memory_max="1G")


@pytest.fixture(scope="module")
def cases_run(tmp_path_factory):
    """One run of the real playbook with two case hosts, `bad` and `good` (each a connection-local host)."""
    tmp_path = tmp_path_factory.mktemp("cases")
    hosts = {name: dict(values, ansible_connection="local")
             for name, values in (("bad", _bad_vars()), ("good", _good_vars()), ("pool", _pool_vars()))}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"sglang_hosts": {"hosts": hosts}}), encoding="utf-8")
    return _run(tmp_path, {}, inventory=str(inventory))


@pytest.fixture(scope="module")
def unrenderable_run(tmp_path_factory):
    """A value that breaks the plan's rendering: still named, with the other inputs' findings."""
    return _run(tmp_path_factory.mktemp("unrenderable"), _extra([row for row in BAD if not _renders(row)]))


FAIL_TASK = "TASK [preflight : Fail with every finding on this host]"


def _host_outcome(stdout: str, host: str) -> tuple[str, str]:
    """The host's line and its indented block at the task that fails with every finding: ('fatal', its
    message), or ('passed', '') when it has no line there (skipped hosts are not shown) and the recap
    has it with no failure; fails the test when the host never got to that task."""
    assert FAIL_TASK in stdout, stdout[-4000:]
    section = stdout.split(FAIL_TASK, 1)[1].split("\nTASK [", 1)[0].split("\nPLAY RECAP", 1)[0]
    lines = section.splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^(fatal|skipping|ok): \[([^\]]+)\]", line)
        if match and match.group(2) == host:
            block = []
            for following in lines[i + 1:]:
                if following and not following[0].isspace():
                    break
                block.append(following)
            return match.group(1), "\n".join(block)
    recap = re.search(rf"(?m)^{re.escape(host)}\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0\b", stdout)
    assert recap, f"host {host} did not reach {FAIL_TASK}:\n{stdout[-4000:]}"
    return "passed", ""


@pytest.mark.parametrize(("what", "values", "names"), BAD, ids=[row[0] for row in BAD])
def test_the_real_preflight_refuses_each_class_naming_its_variable(request, what, values, names):
    if _renders((what, values, names)):
        run = request.getfixturevalue("cases_run")
        status, block = _host_outcome(run.stdout, "bad")
        assert status == "fatal", run.stdout[-3000:]
    else:
        run = request.getfixturevalue("unrenderable_run")
        block = run.stdout
    assert run.returncode != 0
    assert "nothing was changed on any host" in block, block[-3000:]
    findings = _findings(block)
    assert any(names in finding for finding in findings), (what, findings)


def test_the_real_preflight_never_shows_the_key(cases_run, unrenderable_run):
    for run in (cases_run, unrenderable_run):
        assert KEY not in run.stdout + run.stderr


def test_a_good_config_passes_the_real_preflight(cases_run):
    status, block = _host_outcome(cases_run.stdout, "good")
    findings = [f for f in _findings(block) if not HOST_ONLY.search(f)] if status == "fatal" else []
    assert findings == [], cases_run.stdout[-4000:]


def test_the_real_preflight_refuses_a_memory_max_below_the_host_pool(cases_run):
    status, block = _host_outcome(cases_run.stdout, "pool")
    assert status == "fatal", cases_run.stdout[-3000:]
    findings = [f for f in _findings(block) if "sglang_service_memory_max" in f]
    assert len(findings) == 1, _findings(block)
    assert "smaller than the HiCache host pool instance main pins (24 GB" in findings[0]


@pytest.mark.parametrize("name", ["demo", "example"])
def test_the_shipped_inventories_pass_the_input_checks(tmp_path, name):
    inv = json.loads(subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(ROOT / "inventories" / name), "--list"],
        capture_output=True, text=True, timeout=120, check=True, cwd=ROOT,
        env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")),
    ).stdout)
    group = "sglang_hosts"
    while not inv[group].get("hosts"):  # hosts in a child group
        group = inv[group]["children"][0]
    first = inv[group]["hosts"][0]
    # The shipped manifest files are written per site (example) or by demo_prepare (demo): the models
    # plan is left out here; tests/preflight/test_preflight_models.py runs it.
    extra = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "preflight_kernel_accept_unlisted": True, "preflight_check_models": False}
    run = _run(tmp_path, extra, inventory=str(ROOT / "inventories" / name), limit=first)
    assert "Fail with every finding" in run.stdout or run.returncode == 0, run.stdout[-4000:]
    findings = [f for f in _findings(run.stdout) if not HOST_ONLY.search(f)] if run.returncode else []
    assert findings == [], findings


# --- the filter directly: each class refused, naming its variable; the defaults pass ------------------
GOOD_SERVICE = {
    "walk": {"sglang_service_profile": "seed-validated", "sglang_service_instances": [{"name": "main", "port": 1}]},
    "profiles": {"seed-validated": {"--tp-size": 2}, "seed-gfx1100": {}},
    "profile": "seed-validated",
    "instances": [{"name": "main", "port": 30004, "environment": {"HIP_VISIBLE_DEVICES": "0,1"}}],
    "hicache_args": {"--hicache-size": 12},
    "environment": {"sglang_service_environment": {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}},
    "device_allow": ["/dev/kfd rw", "char-drm rw"],
    "system_call_filter": ["@system-service", "pidfd_getfd"],
    "ip_address_allow": ["10.0.0.0/8", "localhost", "fd00::/8"],
    "ip_address_bind_prefix": 24,
    "supplementary_groups": ["render", "video"],
    "read_write_paths": ["/var/lib/sglang/main/cache"],
    "state_dir": "/var/lib/sglang",
    "dirs": {"sglang_service_state_dir": "/var/lib/sglang", "sglang_service_config_dir": "/etc/sglang"},
    "unit_extra": ["CPUAffinity=0-15", "Nice=5"],
    "unit_extra_unsafe": False,
    "driver_units": ["modprobe@amdgpu.service"],
    "rank_interface": "lo",
    "secrets": {"sglang_service_api_key": "abc-DEF_123", "sglang_service_admin_api_key": ""},
    "user": "sglang",
    "group": "sglang",
    # The role's own account (GECOS marker) and group, as on the molecule and demo hosts.
    "accounts": "sglang:x:998:998:SGLang service:/var/lib/sglang:/usr/sbin/nologin\n--\nsglang:x:998:\n",
    "connecting_users": ["root", "deploy"],
    "memory_max": "90%",
    "tasks_max": 8192,
    "allow_kms_nodes": False,
    "pools": {"main": 24, "ab": 0},
    "memtotal_mb": 65536,
}
SERVICE_BAD = [
    ("memory_max", "lots", "sglang_service_memory_max = 'lots' is not a systemd MemoryMax value"),
    ("memory_max", "90%\nExecStartPre=/bin/id", "sglang_service_memory_max = '90%\\nExecStartPre"),
    ("memory_max", "150%", "sglang_service_memory_max = '150%' is not"),
    ("memory_max", "-1", "sglang_service_memory_max = '-1' is not"),
    ("memory_max", "16.5G", "sglang_service_memory_max = '16.5G' is not"),
    ("memory_max", True, "sglang_service_memory_max = True is not"),
    ("memory_max", "16G", "sglang_service_memory_max = '16G' (17.2 GB) is smaller than the HiCache host pool"
                          " instance main pins (24 GB"),
    ("memory_max", 1000000, "sglang_service_memory_max = 1000000 (0.0 GB) is smaller"),
    ("memory_max", "30%", "sglang_service_memory_max = '30%' of this host's RAM (20.6 GB) is smaller"),
    ("tasks_max", "lots", "sglang_service_tasks_max = 'lots' is not a systemd TasksMax value"),
    ("tasks_max", 0, "sglang_service_tasks_max = 0 is not"),
    ("tasks_max", "8192\nUser=root", "sglang_service_tasks_max = '8192\\nUser=root' is not"),
    ("tasks_max", False, "sglang_service_tasks_max = False is not"),
    ("allow_kms_nodes", "maybe", "sglang_service_allow_kms_nodes = 'maybe' is not a boolean"),
    ("walk", {"sglang_service_instances": [{"name": "main", "args": {"--served-model-name": "a\nb"}}]},
     "sglang_service_instances[0]['args']['--served-model-name'] contains a control character"),
    ("profile", "seed\n", "sglang_service_profile:"),
    ("profiles", {"bad name": {}}, "sglang_service_profiles (a profile's name)"),
    ("environment", {"sglang_service_environment": {"A=B\nC": "x"}}, "sglang_service_environment:"),
    ("device_allow", ["/dev/sda rw"], "sglang_service_device_allow[0]"),
    ("system_call_filter", ["~@mount"], "sglang_service_system_call_filter[0]"),
    ("system_call_filter", ["ptrace"], "sglang_service_system_call_filter[0]"),
    ("ip_address_allow", ["0.0.0.0/0"], "sglang_service_ip_address_allow[0]"),
    ("ip_address_allow", ["any"], "sglang_service_ip_address_allow[0]"),
    ("ip_address_bind_prefix", 0, "sglang_service_ip_address_bind_prefix"),
    ("supplementary_groups", ["render", "docker"], "sglang_service_supplementary_groups[1]"),
    ("read_write_paths", ["/"], "sglang_service_read_write_paths[0]"),
    ("read_write_paths", ["/var/lib/sglang/../../etc"], "sglang_service_read_write_paths[0]"),
    ("dirs", {"sglang_service_state_dir": "/"}, "sglang_service_state_dir = '/'"),
    ("unit_extra", ["ProtectSystem=no"], "sglang_service_unit_extra[0] sets ProtectSystem="),
    ("unit_extra", ["ExecStartPre=+/bin/id"], "sglang_service_unit_extra[0] sets ExecStartPre="),
    ("unit_extra", ["[Unit]"], "sglang_service_unit_extra[0] is not one"),
    ("unit_extra", ["Nice=5", "MemoryMax=infinity"], "sglang_service_unit_extra[1] sets MemoryMax=, which the unit "
     "already sets; a second line would override it unseen. Drop it and set sglang_service_memory_max instead."),
    ("unit_extra", ["TasksMax=infinity"], "set sglang_service_tasks_max instead"),
    ("driver_units", ["x.service\nExecStartPre=/bin/id"], "sglang_service_driver_units[0]"),
    ("rank_interface", "lo\n", "sglang_service_rank_interface"),
    ("instances", [{"name": "main", "args": {"--admin-api-key": "k"}}], "sglang_service_instances[0].args sets"),
    ("profiles", {"seed-validated": {"--api-key": "k"}}, "sglang_service_profiles['seed-validated'] sets --api-key"),
    ("hicache_args", {"--config": "/tmp/x.yaml"}, "sglang_service_hicache_args sets --config"),
    ("secrets", {"sglang_service_api_key": KEY + "\n"}, "sglang_service_api_key contains whitespace"),
    ("user", "root", "sglang_service_user = 'root' is root"),
    ("user", "deploy", "is the account Ansible connects as"),
    ("user", "nobody", "sglang_service_user = 'nobody' is an existing account"),
    ("user", "sglang\n", "is not a valid account name"),
    ("group", "shadow", "sglang_service_group = 'shadow' is an existing group"),
    ("group", "render", "sglang_service_group = 'render' is an existing group"),
]
ACCOUNTS = (
    "sglang:x:998:998:SGLang service:/var/lib/sglang:/usr/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n--\nsglang:x:998:\nshadow:x:42:\n"
    "render:x:105:sglang\n"
)


def _accounts_for(user: str, group: str) -> str:
    """getent's answer for exactly this user and group (as the task asks it)."""
    passwd, groups = [], []
    for line in ACCOUNTS.split("--\n")[0].splitlines():
        passwd += [line] if line.split(":")[0] == user else []
    for line in ACCOUNTS.split("--\n")[1].splitlines():
        groups += [line] if line.split(":")[0] == group else []
    return "\n".join(passwd) + "\n--\n" + "\n".join(groups) + "\n"


def test_the_filter_passes_a_good_service_config():
    assert sc.service_input_findings(GOOD_SERVICE) == []


def test_a_pool_larger_than_the_ram_is_left_to_the_ram_check():
    # 65536 MB of RAM: a 128 GB pool does not fit at all; preflight's RAM check says so ("not enough RAM for
    # the HiCache host pools"), not a second finding about a percentage of that RAM.
    big = dict(GOOD_SERVICE, memory_max="90%", pools={"main": 128})
    assert not any("sglang_service_memory_max" in f for f in sc.service_input_findings(big))
    fits = dict(GOOD_SERVICE, memory_max="50%", pools={"main": 48})
    assert any("sglang_service_memory_max = '50%'" in f for f in sc.service_input_findings(fits))


@pytest.mark.parametrize("value", ["infinity", "90%", "100%", "24G", "25000000000", 25000000000, "1T"])
def test_the_filter_passes_memory_max_values_that_hold_the_pool(value):
    assert sc.service_input_findings(dict(GOOD_SERVICE, memory_max=value)) == []
    # A percentage is not checked against RAM the host did not report.
    assert sc.service_input_findings(dict(GOOD_SERVICE, memory_max="1%", memtotal_mb=None)) == []


@pytest.mark.parametrize(("key", "value", "names"), SERVICE_BAD, ids=[f"{r[0]}-{i}" for i, r in enumerate(SERVICE_BAD)])
def test_the_filter_refuses_each_service_class(key, value, names):
    inputs = dict(GOOD_SERVICE, **{key: value})
    inputs["accounts"] = _accounts_for(str(inputs["user"]), str(inputs["group"]))
    found = sc.service_input_findings(inputs)
    assert any(names in finding for finding in found), found
    assert all(KEY not in finding for finding in found)


def test_unit_extra_unsafe_is_the_named_override_but_never_for_control_characters():
    inputs = dict(GOOD_SERVICE, unit_extra=["User=root"], unit_extra_unsafe=True)
    assert sc.service_input_findings(inputs) == []
    inputs["unit_extra"] = ["User=root\nExecStartPre=+/bin/id"]
    assert any("is not one `Directive=value` line" in f for f in sc.service_input_findings(inputs))


GOOD_RUN = {
    "probe": {"rollout_probe_input_len_canary": 128000, "rollout_probe_input_len": "32000",
              "rollout_probe_repeats": 3, "rollout_probe_max_warm_cold_ratio": 0.2,
              "rollout_probe_min_cached_fraction": "0.9", "rollout_probe_max_warm_ttft_s": None,
              "rollout_probe_max_regression": 1.0, "rollout_probe_regression_slack_ms": 250},
    "booleans": {"rollout_probe_use_baseline": "false", "rollout_fast_path": True},
    "knobs": {"preflight_expected_gpus": "2"},
    "host": "node-1.example.org",
    "rocm_key_url": "https://repo.radeon.invalid/rocm/rocm.gpg.key",
    "secrets": {"rollout_router_api_key": ""},
}
RUN_BAD = [
    ("probe", {"rollout_probe_min_cached_fraction": 1.5}, "rollout_probe_min_cached_fraction = 1.5 is out of range"),
    ("probe", {"rollout_probe_min_host_cached_fraction": -0.1}, "rollout_probe_min_host_cached_fraction"),
    ("probe", {"rollout_probe_max_warm_cold_ratio": 50}, "rollout_probe_max_warm_cold_ratio = 50"),
    ("probe", {"rollout_probe_repeats": 10**6}, "rollout_probe_repeats"),
    ("probe", {"rollout_probe_repeats": "3\n"}, "rollout_probe_repeats = '3\\n' is not a whole number"),
    ("booleans", {"rollout_probe_use_baseline": "flase"}, "rollout_probe_use_baseline = 'flase' is not a boolean"),
    ("knobs", {"preflight_mamba_device_bytes": -1}, "preflight_mamba_device_bytes = -1 is out of range"),
    ("knobs", {"preflight_probe_device_tokens": "1.5"}, "preflight_probe_device_tokens"),
    ("host", "../../etc/x", "the inventory host name '../../etc/x'"),
    ("host", "node\n", "the inventory host name"),
    ("rocm_key_url", "http://repo.invalid/rocm.gpg.key", "rocm_amd_key_url"),
    ("secrets", {"rollout_router_api_key": "a b"}, "rollout_router_api_key contains whitespace"),
    ("router_url", "http://127.0.0.1:30000/workers", "rollout_router_url = 'http://127.0.0.1:30000/workers' is not"),
    ("router_url", "http://127.0.0.1:30000\nX", "rollout_router_url"),
    ("router_url", "ftp://127.0.0.1:30000", "rollout_router_url"),
    ("router_url", "http://ops:pw@127.0.0.1:30000", "rollout_router_url = 'http://127.0.0.1:30000' carries a user"),
]


def test_the_filter_passes_good_run_settings():
    assert pi.run_input_findings(GOOD_RUN) == []


@pytest.mark.parametrize(("key", "value", "names"), RUN_BAD, ids=[f"{r[0]}-{i}" for i, r in enumerate(RUN_BAD)])
def test_the_filter_refuses_each_run_class(key, value, names):
    inputs = dict(GOOD_RUN, **{key: value})
    found = pi.run_input_findings(inputs)
    assert any(names in finding for finding in found), found


def test_a_plain_http_base_url_makes_the_derived_key_url_refused():
    inputs = dict(GOOD_RUN, rocm_key_url="", rocm_repo_base_url="http://mirror.invalid")
    assert any("rocm_amd_key_url" in f for f in pi.run_input_findings(inputs))


def test_the_key_url_finding_does_not_repeat_a_mirrors_password():
    """Issue 24: findings are printed and go into reports; a URL's user:password@ is left out."""
    inputs = dict(GOOD_RUN, rocm_key_url="", rocm_repo_base_url="http://bob:pw-Finding-3@mirror.invalid")
    (finding,) = [f for f in pi.run_input_findings(inputs) if "rocm_amd_key_url" in f]
    assert "'http://mirror.invalid/rocm/rocm.gpg.key'" in finding
    assert "pw-Finding-3" not in finding


@pytest.mark.parametrize("url", ["", "http://127.0.0.1:30000", "https://router.invalid:8443/"])
def test_a_router_base_url_or_none_passes(url):
    assert pi.run_input_findings(dict(GOOD_RUN, router_url=url)) == []


def test_the_router_url_finding_does_not_repeat_its_password():
    (finding,) = pi.run_input_findings(dict(GOOD_RUN, router_url="http://ops:pw-Router-5@127.0.0.1:30000"))
    assert "pw-Router-5" not in finding
    assert "rollout_router_api_key" in finding


def test_user_ranges_add_to_the_built_in_ones_never_replace_them():
    table = json.loads((ROOT / "roles/sglang_service/files/sglang-flags.json").read_text())
    errors = sc.sglang_argv(["--mem-fraction-static", "1.5"], table, {"--mem-fraction-static": {"gt": -1}})
    assert any("out of range" in e for e in errors)
    errors = sc.sglang_argv(["--mem-fraction-static", "0.97"], table, {"--mem-fraction-static": {"lt": 0.95}})
    assert any("< 0.95" in e for e in errors)


def test_names_and_batches_are_full_string_matches():
    plan = [{"name": "main\n", "unit": "sglang-main.service", "port": 30004, "profile": "p", "profile_known": True}]
    found = sc.config_findings(plan, [], {}, {"profiles": ["p"]})
    assert any("is not valid" in f for f in found)
    found = pf.rollout_findings({"batches": ["25%\n"], "probe": {}})
    assert any("is not a batch size" in f for f in found)


def test_every_role_that_creates_the_service_user_marks_it_as_preflight_expects():
    """rocm creates the service user before sglang_service does (rocm_service_users): both must set the
    GECOS mark preflight knows the toolkit's account by, or the stage's check refuses the account the
    ROCm phase created a minute earlier."""
    marker = sc.ACCOUNT_MARKER
    rocm = yaml.safe_load((ROOT / "roles/rocm/defaults/main.yml").read_text())
    assert rocm["rocm_service_user_comment"] == marker
    assert "comment: \"{{ rocm_service_user_comment }}\"" in (ROOT / "roles/rocm/tasks/users.yml").read_text()
    user_task = yaml.safe_load((ROOT / "roles/sglang_service/tasks/user.yml").read_text())
    comments = [t["ansible.builtin.user"].get("comment") for t in user_task if "ansible.builtin.user" in t]
    assert comments == [marker]


def test_a_host_whose_plan_rendered_fails_closed_beside_one_whose_plan_did_not(tmp_path):
    """ansible-core takes every host of the task into preflight's rescue when one host's plan fails to
    render; the host whose plan rendered has no failed result of its own. It must fail with a finding
    that says why (never a templating error), and the broken host must still list its own findings."""
    hosts = {"broken": dict(_extra([row for row in BAD if not _renders(row)]), ansible_connection="local"),
             "good": dict(_good_vars(), ansible_connection="local")}
    (tmp_path / "hosts.yml").write_text(json.dumps({"sglang_hosts": {"hosts": hosts}}), encoding="utf-8")
    run = _run(tmp_path, {}, inventory=str(tmp_path / "hosts.yml"))
    assert run.returncode != 0
    assert "is undefined" not in run.stdout, run.stdout[-3000:]
    recap = dict(re.findall(r"(?m)^(broken|good)\s+:.*?failed=(\d+)", run.stdout))
    assert recap == {"broken": "1", "good": "1"}, run.stdout[-3000:]
    assert "preflight found" in run.stdout
    assert "on broken" in run.stdout
    assert "another host's plan failed in the same task" in " ".join(run.stdout.split())


# The sglang_service role's own knobs (sglang_service_knob_findings): its reserves and flag ranges.
GOOD_KNOBS = {"sglang_service_memory_reserve_gb": 16, "sglang_service_sglang_reserve_gib": "10",
              "sglang_service_flag_ranges": {"--mem-fraction-static": {"lt": 0.95}}}
KNOBS_BAD = [
    ({"sglang_service_memory_reserve_gb": -1}, "sglang_service_memory_reserve_gb = -1 is out of range"),
    ({"sglang_service_sglang_reserve_gib": "ten"}, "sglang_service_sglang_reserve_gib = 'ten' is not a number"),
    ({"sglang_service_flag_ranges": {"--port": {"min": "x"}}}, "sglang_service_flag_ranges['--port']"),
    ({"sglang_service_flag_ranges": ["--port"]}, "sglang_service_flag_ranges = ['--port'] is not a mapping"),
]


def test_the_service_knobs_pass_good_values():
    assert sc.knob_findings(GOOD_KNOBS) == []


@pytest.mark.parametrize(("value", "names"), KNOBS_BAD, ids=[str(i) for i in range(len(KNOBS_BAD))])
def test_the_service_knobs_refuse_each_bad_value(value, names):
    found = sc.knob_findings({**GOOD_KNOBS, **value})
    assert len(found) == 1, found
    assert names in found[0], found
