"""The unit confines its own damage (issue 24 item 5), rendered by Ansible through the role's plan phase.

- MemoryMax= and TasksMax= sit next to LimitMEMLOCK=infinity (defaults 90 % and 8192; the knobs change them);
- DeviceAllow lists /dev/kfd and the host's DRM render nodes one by one (the plan reads /dev/dri; here a
  fake list stands for it), never the KMS card nodes, and `char-drm rw` only with sglang_service_allow_kms_nodes;
- on a host without /dev/dri (this one, the test hosts) only /dev/kfd, and the unit passes systemd-analyze verify;
- the JIT caches (XDG, Triton, MIOpen) live under <state>/<name>/cache/<release id>/, the only other
  writable path besides the home; the release id still covers every line of the unit;
- prune removes the cache directories whose release is gone, and rollback's and stage's directory lists
  give the cache root to root and the release's cache to the service.
"""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from plugins import load
from service_render import run_plans

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "sglang_service"

INSTANCES = [{"name": "main", "port": 30004}]
FAKE_NODES = ["/dev/dri/renderD129", "/dev/dri/renderD128", "/dev/dri/card0",
              "/dev/dri/renderD130\nExecStartPre=/bin/id"]


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> dict[str, Path]:
    """Every case in one Ansible run (each an inventory host with its own variables)."""
    base = {"sglang_service_instances": INSTANCES}
    cases = {
        "host": base,  # reads this machine's /dev/dri
        "nodes": {**base, "_sglang_service_render_nodes": FAKE_NODES},
        "kms": {**base, "_sglang_service_render_nodes": FAKE_NODES, "sglang_service_allow_kms_nodes": True},
        "limits": {**base, "_sglang_service_render_nodes": [], "sglang_service_memory_max": "96G",
                   "sglang_service_tasks_max": "infinity"},
    }
    outs = {name: (tmp_path_factory.mktemp(f"confine-{name}"), extra) for name, extra in cases.items()}
    run_plans(tmp_path_factory.mktemp("confine-run"), outs)
    return {name: out for name, (out, _) in outs.items()}


def unit(out: Path) -> list[str]:
    return (out / "sglang-main.service").read_text(encoding="utf-8").splitlines()


def plan(out: Path) -> dict:
    return {entry["name"]: entry for entry in json.loads((out / "plan.json").read_text(encoding="utf-8"))}


def device_lines(out: Path) -> list[str]:
    return [line for line in unit(out) if line.startswith("DeviceAllow=")]


def test_memory_and_tasks_limits_sit_next_to_the_memlock_limit(renders):
    lines = unit(renders["nodes"])
    at = lines.index("LimitMEMLOCK=infinity")
    assert "MemoryMax=90%" in lines[at:at + 5]
    assert "TasksMax=8192" in lines[at:at + 5]
    limits = unit(renders["limits"])
    assert "MemoryMax=96G" in limits
    assert "TasksMax=infinity" in limits
    assert plan(renders["limits"])["main"]["config_hash"] != plan(renders["nodes"])["main"]["config_hash"]


def test_only_the_render_nodes_are_allowed(renders):
    assert device_lines(renders["nodes"]) == [
        "DeviceAllow=/dev/kfd rw", "DeviceAllow=/dev/dri/renderD128 rw", "DeviceAllow=/dev/dri/renderD129 rw"]
    text = "\n".join(unit(renders["nodes"]))
    assert "ExecStartPre" not in text
    assert "card0" not in text


def test_char_drm_only_with_the_opt_in(renders):
    assert device_lines(renders["kms"]) == [
        "DeviceAllow=/dev/kfd rw", "DeviceAllow=/dev/dri/renderD128 rw", "DeviceAllow=/dev/dri/renderD129 rw",
        "DeviceAllow=char-drm rw"]


def test_the_plan_reads_the_hosts_render_nodes(renders):
    nodes = sorted(glob.glob("/dev/dri/renderD*"), key=lambda node: int(node.rsplit("D", 1)[1]))
    assert device_lines(renders["host"]) == ["DeviceAllow=/dev/kfd rw"] + [f"DeviceAllow={n} rw" for n in nodes]
    assert plan(renders["host"])["main"]["render_nodes"] == sorted(nodes)


def test_jit_caches_live_under_the_release(renders):
    entry = plan(renders["nodes"])["main"]
    release_id = entry["config_hash"][:12]
    cache = f"/var/lib/sglang/main/cache/{release_id}"
    assert entry["cache_dir"] == cache
    assert entry["release_dir"].endswith("/" + release_id)
    lines = unit(renders["nodes"])
    for line in (f"Environment=XDG_CACHE_HOME={cache}/xdg", f"Environment=TRITON_CACHE_DIR={cache}/triton",
                 f"Environment=MIOPEN_USER_DB_PATH={cache}/miopen-db",
                 f"Environment=MIOPEN_CUSTOM_CACHE_DIR={cache}/miopen-cache",
                 f"ReadWritePaths=/var/lib/sglang/main/home {cache}"):
        assert line in lines, line
    assert not [line for line in lines if "/home/.cache" in line or "/home/.triton" in line]
    # The unit the plan publishes is the one the release directory holds (release_instances).
    filters = load(ROLE / "filter_plugins" / "sglang_service.py")
    (staged,) = filters.release_instances([entry], "/opt/sglang/current/bin/python")
    assert staged["unit"] == entry["unit_content"]
    assert cache in staged["unit"]


def test_the_host_without_dev_dri_unit_passes_systemd_analyze_verify(renders, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    text, skipping = [], False
    for line in unit(renders["limits"]):
        if line.startswith("ExecStart="):
            text.append(f"ExecStart={sys.executable} -c pass")
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        text.append(line)
    assert [line for line in text if line.startswith("DeviceAllow=")] == ["DeviceAllow=/dev/kfd rw"]
    path = tmp_path / "sglang-main.service"
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    run = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert [line for line in run.stderr.splitlines() if "sglang-main.service" in line] == [], run.stderr


# --- the filters as plain functions ----------------------------------------------------------------
def _filters():
    return load(ROLE / "filter_plugins" / "sglang_service.py")


def test_device_allow_filter():
    f = _filters()
    assert f.device_allow(["/dev/kfd rw"], ["/dev/dri/renderD1000", "/dev/dri/renderD128"], False) == [
        "/dev/kfd rw", "/dev/dri/renderD128 rw", "/dev/dri/renderD1000 rw"]
    assert f.device_allow(["/dev/kfd rw", "char-drm rw"], [], True) == ["/dev/kfd rw", "char-drm rw"]
    assert f.device_allow([], ["/dev/dri/renderDx", "/dev/dri/card1", "/dev/sda"], False) == []


def test_cache_directories_give_the_root_to_root_and_the_release_cache_to_the_service():
    f = _filters()
    dirs = f.cache_directories("/var/lib/sglang/main/cache", "/var/lib/sglang/main/releases/abcdef012345", "sg", "sg")
    assert dirs[0] == {"path": "/var/lib/sglang/main/cache", "owner": "root", "group": "root", "mode": "0755"}
    assert [d["path"] for d in dirs[1:]] == ["/var/lib/sglang/main/cache/abcdef012345"] + [
        f"/var/lib/sglang/main/cache/abcdef012345/{sub}" for sub in ("xdg", "triton", "miopen-db", "miopen-cache")]
    assert {(d["owner"], d["mode"]) for d in dirs[1:]} == {("sg", "0750")}
    entry = {"state_dir": "/s/main", "releases_dir": "/s/main/releases", "home_dir": "/s/main/home",
             "cache_root": "/s/main/cache", "cache_dir": "/s/main/cache/abcdef012345"}
    listed = f.directories([entry], "/etc/sglang", "/s", "/usr/local/libexec/x", "sg", "sg")
    assert [d["path"] for d in listed][-6:] == [d["path"] for d in f.cache_directories(
        "/s/main/cache", "abcdef012345", "sg", "sg")]
    previous = {"item": {"cache_root": "/s/main/cache"}, "stat": {"lnk_source": "/s/main/releases/0123456789ab"}}
    assert f.rollback_cache_directories(previous, "sg", "sg")[1]["path"] == "/s/main/cache/0123456789ab"


def test_prune_caches_keeps_the_caches_of_kept_releases():
    f = load("module_utils/sglang_service_release.py")
    found = [{"path": "/s/main/cache/aaaaaaaaaaaa"}, {"path": "/s/main/cache/bbbbbbbbbbbb"},
             {"path": "/s/main/cache/cccccccccccc"}]
    kept = ["/s/main/releases/aaaaaaaaaaaa", "/s/main/releases/cccccccccccc/"]
    assert f.prune_caches(found, kept) == ["/s/main/cache/bbbbbbbbbbbb"]
    assert f.prune_caches(found, []) == [entry["path"] for entry in found]


# --- prune on a tmp dir, through the role's prune entry point on localhost --------------------------
PRUNE_PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: sglang_service
        tasks_from: prune
"""


def test_prune_removes_a_pruned_releases_cache(tmp_path):
    import os
    import time

    state = tmp_path / "state"
    releases, caches = state / "main" / "releases", state / "main" / "cache"
    ids = [f"{i:012x}" for i in range(4)]
    for age, rid in enumerate(ids):
        (releases / rid).mkdir(parents=True)
        (releases / rid / "release.json").write_text(json.dumps({"name": "main", "config_hash": rid}) + "\n")
        (caches / rid / "triton").mkdir(parents=True)
        (caches / rid / "triton" / "kernel.bin").write_text("x")
        old = time.time() - 1000 * (len(ids) - age)
        os.utime(releases / rid, (old, old))
    (caches / "orphan000000").mkdir()  # a cache whose release was pruned before caches were
    os.symlink(releases / ids[0], state / "main" / "current")  # the oldest, but current: kept
    extra = {"ansible_python_interpreter": sys.executable, "sglang_service_state_dir": str(state),
             "sglang_service_releases_keep": 1, "_sglang_service_render_nodes": [],
             "sglang_service_instances": INSTANCES, "sglang_service_model_path": "/srv/models/main",
             "sglang_service_draft_model_path": "/srv/models/draft"}
    (tmp_path / "prune.yml").write_text(PRUNE_PLAYBOOK, encoding="utf-8")
    (tmp_path / "extra.json").write_text(json.dumps(extra), encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_FACT_CACHING="memory", ANSIBLE_NOCOLOR="1")
    run = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                          str(tmp_path / "prune.yml"), "-e", "@" + str(tmp_path / "extra.json")],
                         env=env, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # keep 1 (the newest, ids[3]) plus current (ids[0]); ids[1] and ids[2] go, with their caches.
    assert sorted(p.name for p in releases.iterdir()) == [ids[0], ids[3]]
    assert sorted(p.name for p in caches.iterdir()) == [ids[0], ids[3]]
    assert (caches / ids[3] / "triton" / "kernel.bin").read_text() == "x"
