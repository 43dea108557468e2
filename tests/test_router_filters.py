"""The router and monitoring roles' filters (plain functions), and the router's launcher against the
real sglang-router parser when its venv is in the cache."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
from jinja_old import expr

ROOT = Path(__file__).resolve().parents[1]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROUTER = _load(ROOT / "roles" / "router" / "filter_plugins" / "router.py")
FLEET = _load(ROOT / "roles" / "router" / "filter_plugins" / "fleet_endpoints.py")
HOSTVARS = {
    "a": {"ansible_host": "10.0.0.1"},
    "b": {"ansible_host": "10.0.0.2", "sglang_service_instances": [{"name": "x", "port": 30010},
                                                                   {"name": "y", "port": 30011}]},
    "c": {"rollout_router_worker_host": "c.internal", "ansible_host": "10.0.0.3"},
}


def test_router_filters_are_the_monitoring_ones():
    link = ROOT / "roles" / "router" / "filter_plugins" / "fleet_endpoints.py"
    assert link.is_symlink()
    assert link.resolve() == (ROOT / "roles" / "monitoring" / "filter_plugins" / "fleet_endpoints.py").resolve()


def test_fleet_endpoints_from_the_inventory():
    urls = [e["url"] for e in FLEET.fleet_endpoints(HOSTVARS, ["a", "b", "c"])]
    assert urls == ["http://10.0.0.1:30004", "http://10.0.0.2:30010", "http://10.0.0.2:30011",
                    "http://c.internal:30004"]


def test_fleet_endpoints_reject_a_shared_port():
    hostvars = {"a": {"ansible_host": "h", "sglang_service_instances": [{"name": "m", "port": 1},
                                                                       {"name": "n", "port": 1}]}}
    with pytest.raises(ValueError, match="sglang_service_instances"):
        FLEET.fleet_endpoints(hostvars, ["a"])


def test_router_argv():
    assert ROUTER.router_argv({"--policy": "cache_aware", "--api-key": None, "--x": True, "--y": False,
                               "--keys": ["a:b:admin:k"], "--port": 30000}) == [
        "--policy", "cache_aware", "--x", "--keys", "a:b:admin:k", "--port", "30000"]
    with pytest.raises(ValueError, match="router_extra_args"):
        ROUTER.router_argv({"policy": "x"})


def test_router_worker_changes():
    listed = [{"id": "1", "url": "http://a:1/"}, {"id": "2", "url": "http://old:1"}, {"id": "3", "url": "http://a:1"}]
    assert ROUTER.router_worker_changes(listed, ["http://a:1", "http://b:1"]) == {
        "add": ["http://b:1"], "remove": [{"id": "2", "url": "http://old:1"}, {"id": "3", "url": "http://a:1"}]}
    same = ROUTER.router_worker_changes([{"id": "1", "url": "http://a:1"}], ["http://a:1/"])
    assert same == {"add": [], "remove": []}


ROUTER_PYTHON = ROOT / ".cache" / "sglang-router-venv" / "bin" / "python"


@pytest.mark.shared_state
@pytest.mark.skipif(not ROUTER_PYTHON.exists(), reason="no sglang-router venv in .cache (molecule prepares it)")
def test_launcher_checks_with_the_real_router_parser(tmp_path):
    launch = ROOT / "roles" / "router" / "files" / "launch.py"
    good = tmp_path / "good.json"
    good.write_text(json.dumps(["--host", "127.0.0.1", "--port", "30000", "--policy", "cache_aware",
                                "--control-plane-api-keys", "hicache-fleet:hicache-fleet:admin:s3cret"]))
    run = subprocess.run([str(ROUTER_PYTHON), str(launch), "--check", str(good)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "policy cache_aware" in run.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(["--policy", "cache-aware"]))
    run = subprocess.run([str(ROUTER_PYTHON), str(launch), "--check", str(bad)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 2
    assert "invalid choice: 'cache-aware'" in run.stderr


# --- the filters that replaced inline ternaries in tasks/main.yml, against the old Jinja ------------

@pytest.mark.parametrize("key", ["", "s3cret", None])
def test_auth_headers_and_control_plane_keys(key):
    assert ROUTER.router_auth_headers(key) == expr("{'Authorization': 'Bearer ' ~ k} if k else {}", k=key)
    old = expr("['hicache-fleet:hicache-fleet:admin:' ~ k] if k else none", k=key)
    assert ROUTER.router_control_plane_keys(key) == old
    assert expr("k or none", k=key) == expr("k if k else none", k=key)  # --api-key


@pytest.mark.parametrize("wheelhouse", ["", "/srv/wheelhouse/router"])
def test_install_source_and_pip_argv(wheelhouse):
    assert ROUTER.router_install_source(wheelhouse) == expr("'offline' if w | length > 0 else 'index'", w=wheelhouse)
    old = expr("[venv ~ '/bin/python', '-m', 'pip', 'install', '--quiet', '--disable-pip-version-check']"
               " + (['--no-index', '--find-links', root ~ '/wheelhouse'] if w | length > 0 else [])"
               " + ['-r', root ~ '/requirements.txt']", venv="/opt/r/venv", root="/opt/r", w=wheelhouse)
    assert ROUTER.router_pip_argv("/opt/r/venv", "/opt/r", wheelhouse) == old
