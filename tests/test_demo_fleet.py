"""A demo fleet of N (`make demo DEMO_HOSTS=N`, scripts/demo.sh) without booting a host: DEMO_HOSTS is
checked before anything boots, `make demo-down` stops every demo host and only those, and the extra
hosts' inventory (scripts/demo_inventory.py) puts demo-4..N under the demo's group_vars with the
paths the three resolve."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO_SH = ROOT / "scripts" / "demo.sh"
BIN = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"
# What demo.sh and hosts.sh need up to their first host (hosts.sh list, down): no systemd-nspawn, no
# ssh-keygen, no debootstrap, so that a host `up` would refuse at once ("missing ...") in these tests.
TOOLS = ("bash", "env", "awk", "seq", "cat", "dirname", "basename", "rm", "mkdir", "mountpoint", "umount",
         "sed", "grep", "tr", "id", "make", "sort", "tail", "ls", "xargs", "python3")


def _module():
    spec = importlib.util.spec_from_file_location("demo_inventory", ROOT / "scripts" / "demo_inventory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo_inventory = _module()


@pytest.fixture
def jail(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH holds only TOOLS and whose test-host state is tmp_path/cache."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found:
            (bindir / tool).symlink_to(found)
    (tmp_path / "cache").mkdir()
    return {"PATH": str(bindir), "HICACHE_FLEET_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path)}


def demo(env: dict[str, str], *args: str, hosts: str | None = None) -> subprocess.CompletedProcess:
    env = dict(env)
    if hosts is not None:
        env["DEMO_HOSTS"] = hosts
    return subprocess.run([str(DEMO_SH), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
                          check=False)


def fake_host(cache: Path, name: str, address: str) -> Path:
    """A stopped test host as hosts.sh keeps one (its directory, no nspawn.pid): `down` just removes it."""
    host = cache / "hosts" / name
    host.mkdir(parents=True)
    (host / "address").write_text(address + "\n")
    return host


# --- DEMO_HOSTS is checked before anything boots ------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "41", "abc", "-1", "3.5", "012", "1e1", " 4", "100"])
def test_a_bad_demo_hosts_is_refused_before_anything_boots(jail, value):
    cache = Path(jail["HICACHE_FLEET_CACHE"])
    fake_host(cache, "demo-7", "127.0.30.7")  # a host of an earlier, larger demo: left alone
    done = demo(jail, hosts=value)
    assert done.returncode == 2, done.stderr
    assert f"DEMO_HOSTS must be an integer from 1 to 40 (got '{value}'); nothing was booted" in done.stderr
    assert "Boot the demo fleet" not in done.stdout
    assert sorted(p.name for p in cache.iterdir()) == ["hosts"]
    assert [p.name for p in (cache / "hosts").iterdir()] == ["demo-7"]


def test_make_demo_passes_demo_hosts_and_refuses_it_the_same_way(jail):
    # `make demo` runs setup first; demo.sh's own check is what refuses, with the same message.
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "DEMO_HOSTS ?= 3" in makefile
    assert "DEMO_HOSTS='$(DEMO_HOSTS)' ./scripts/demo.sh" in makefile
    assert "./scripts/demo.sh --down" in makefile


def test_a_good_demo_hosts_passes_the_check_and_a_larger_fleets_hosts_are_stopped(jail):
    cache = Path(jail["HICACHE_FLEET_CACHE"])
    for i in (2, 12, 13, 40):
        fake_host(cache, f"demo-{i}", f"127.0.30.{i}")
    fake_host(cache, "rollout-1", "127.0.17.1")
    done = demo(jail, hosts="12")
    # Past the check: the boot starts and stops at hosts.sh's own tool check (no systemd-nspawn here).
    assert "Boot the demo fleet of 12 (DEMO_HOSTS)" in done.stdout
    assert done.returncode != 0
    assert "missing systemd-nspawn" in done.stderr
    # demo-13 and demo-40 are not in a fleet of 12; demo-2 and demo-12 are, rollout-1 is no demo host.
    assert sorted(p.name for p in (cache / "hosts").iterdir()) == ["demo-12", "demo-2", "rollout-1"]


def test_the_default_is_three_hosts(jail):
    done = demo(jail)
    assert "Boot the demo fleet: three Debian guests" in done.stdout
    assert "missing systemd-nspawn" in done.stderr


# --- make demo-down ----------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["script", "make"])
def test_demo_down_removes_every_demo_host_and_the_extra_inventory_and_nothing_else(jail, how):
    cache = Path(jail["HICACHE_FLEET_CACHE"])
    for i in (1, 2, 3, 4, 12, 40):
        fake_host(cache, f"demo-{i}", f"127.0.30.{i}")
    fake_host(cache, "rollout-gate-1", "127.0.19.1")
    fake_host(cache, "demo-router", "127.0.30.200")  # not demo-<number>: not a demo fleet host
    extra = cache / "demo" / "hosts-extra.yml"
    extra.parent.mkdir()
    extra.write_text("sglang_hosts: {}\n")
    if how == "make":
        done = subprocess.run(["make", "-s", "demo-down"], capture_output=True, text=True, env=jail, cwd=ROOT,
                              timeout=60, check=False)
    else:
        done = demo(jail, "--down")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (cache / "hosts").iterdir()) == ["demo-router", "rollout-gate-1"]
    assert not extra.exists()


def test_demo_down_with_nothing_up_is_a_no_op(jail):
    done = demo(jail, "--down")
    assert (done.returncode, done.stderr) == (0, "")


# --- the extra hosts' inventory --------------------------------------------------------------------------

def test_host_count_takes_1_to_40_and_names_what_it_refused():
    assert [demo_inventory.host_count(v) for v in ("1", "3", "12", "40", 7)] == [1, 3, 12, 40, 7]
    for bad in ("0", "41", "abc", "", "-3", "012", "2.0"):
        with pytest.raises(ValueError, match=rf"from 1 to 40 \(got '{bad}'\)"):
            demo_inventory.host_count(bad)


def test_the_extra_inventory_holds_demo_4_to_n_with_the_threes_per_host_vars(tmp_path):
    data = yaml.safe_load(demo_inventory.render(12))
    assert list(data) == ["sglang_hosts"]
    extra = data["sglang_hosts"]["hosts"]
    assert list(extra) == [f"demo-{i}" for i in range(4, 13)]
    demo_dir = str(ROOT / "inventories" / "demo")
    for i in range(4, 13):
        assert extra[f"demo-{i}"] == {"ansible_host": f"127.0.30.{i}", "inventory_dir": demo_dir}
    # The three's own per-host vars: ansible_host, and for demo-2 and demo-3 the RAM their simulators are
    # told (two host classes for playbooks/hicache_sizing.yml); the rest is the group's, so the extra
    # hosts are demo-1's kind (64 GB).
    three = yaml.safe_load((ROOT / "inventories" / "demo" / "hosts.yml").read_text())["sglang_hosts"]["hosts"]
    assert {name: set(v) for name, v in three.items()} == {
        "demo-1": {"ansible_host"}, "demo-2": {"ansible_host", "demo_host_ram_gb"},
        "demo-3": {"ansible_host", "demo_host_ram_gb"}}
    assert (three["demo-2"]["demo_host_ram_gb"], three["demo-3"]["demo_host_ram_gb"]) == (48, 256)
    assert demo_inventory.hosts(3) == {name: v["ansible_host"] for name, v in three.items()}


def test_write_removes_the_file_for_a_fleet_of_three_or_less(tmp_path):
    out = tmp_path / "demo" / "hosts-extra.yml"
    assert demo_inventory.write(4, out) == out
    assert list(yaml.safe_load(out.read_text())["sglang_hosts"]["hosts"]) == ["demo-4"]
    assert "make demo DEMO_HOSTS=4" in out.read_text()
    assert demo_inventory.write(3, out) is None
    assert not out.exists()
    assert demo_inventory.write(1, out) is None


def test_the_script_refuses_a_bad_count():
    script = ROOT / "scripts" / "demo_inventory.py"
    done = subprocess.run([str(BIN / "python"), str(script), "41", "/nonexistent/x.yml"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "DEMO_HOSTS must be an integer from 1 to 40 (got '41')" in done.stderr


def _ansible(*args: str, cache: str | None = None) -> str:
    """Ansible on the controller; HICACHE_FLEET_CACHE is `cache` (unset when None)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FACT_CACHING": "memory"}
    env.pop("HICACHE_FLEET_CACHE", None)
    if cache is not None:
        env["HICACHE_FLEET_CACHE"] = cache
    return subprocess.run([*args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
                          check=True).stdout


def test_ansible_puts_the_extra_hosts_under_the_demo_group_vars_with_the_threes_paths(tmp_path):
    """Ansible itself: the second source's hosts are in sglang_hosts, inventories/demo/group_vars and the
    group vars of hosts.yml apply to them, and every inventory_dir-relative path (the SSH key, the
    controller cache, the run reports and lock) is the one demo-1 resolves, wherever the file lives."""
    extra = demo_inventory.write(12, tmp_path / "somewhere" / "hosts-extra.yml")
    sources = ["-i", str(ROOT / "inventories" / "demo"), "-i", str(extra)]
    graph = _ansible(str(BIN / "ansible-inventory"), *sources, "--graph")
    assert all(f"--demo-{i}\n" in graph for i in range(1, 13)), graph
    listed = yaml.safe_load(_ansible(str(BIN / "ansible-inventory"), *sources, "--list"))
    assert listed["sglang_hosts"]["hosts"] == [f"demo-{i}" for i in range(1, 13)]
    # One debug task per host on the controller (no connection to the hosts, which are not up).
    names = ("inventory_dir", "_demo_cache", "ansible_ssh_private_key_file", "ansible_user",
             "sglang_service_bind_address", "rollout_batches", "sglang_service_environment",
             "sglang_service_hicache_args")
    out = _ansible(str(BIN / "ansible"), *sources, "demo-1,demo-4,demo-12", "-o", "-m", "ansible.builtin.debug",
                   "-a", "msg={{ {" + ", ".join(f"'{n}': {n}" for n in names) + "} }}")
    seen = {}
    for line in out.splitlines():
        host, _, rest = line.partition(" | SUCCESS => ")
        seen[host] = yaml.safe_load(rest)["msg"]
    assert set(seen) == {"demo-1", "demo-4", "demo-12"}, out
    for host in ("demo-4", "demo-12"):
        assert seen[host]["sglang_service_bind_address"] == f"127.0.30.{host.split('-')[1]}"
        for name in set(names) - {"sglang_service_bind_address"}:
            assert seen[host][name] == seen["demo-1"][name], (host, name)
    assert seen["demo-12"]["inventory_dir"] == str(ROOT / "inventories" / "demo")
    assert Path(seen["demo-12"]["ansible_ssh_private_key_file"]).resolve() == ROOT / ".cache" / "ssh" / "id_ed25519"
    assert seen["demo-12"]["rollout_batches"] == [1, 1, "100%"]  # from inventories/demo/group_vars


def test_the_demo_fleets_ssh_key_and_controller_cache_follow_hicache_fleet_cache(tmp_path):
    """make demo with HICACHE_FLEET_CACHE boots the hosts with that cache's key (molecule/resources/
    hosts.sh): the inventory connects with the same key and reads the wheelhouse and models there."""
    cache = tmp_path / "elsewhere"
    names = ("ansible_ssh_private_key_file", "_demo_cache")
    out = _ansible(str(BIN / "ansible"), "-i", str(ROOT / "inventories" / "demo"), "demo-1", "-o",
                   "-m", "ansible.builtin.debug", "-a", "msg={{ {" + ", ".join(f"'{n}': {n}" for n in names) + "} }}",
                   cache=str(cache))
    seen = yaml.safe_load(out.partition(" | SUCCESS => ")[2])["msg"]
    assert seen == {"ansible_ssh_private_key_file": f"{cache}/ssh/id_ed25519", "_demo_cache": str(cache)}, out
