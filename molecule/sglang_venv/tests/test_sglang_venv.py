"""What sglang_venv leaves on a host after release A, check mode and release B (see molecule.yml)."""

import json
import os
import shlex

import pytest
import testinfra.utils.ansible_runner

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"]).get_hosts("all")

ROOT = "/opt/sglang"
SIM = os.path.isfile(os.path.join(os.environ["MOLECULE_PROJECT_DIRECTORY"], "sim", "pyproject.toml"))


def _releases(host):
    out = host.check_output(f"find {ROOT}/venvs -mindepth 1 -maxdepth 1 -type d -printf '%f\\n'")
    return sorted(out.split())


def _run_python(host, python, code):
    cmd = host.run(f"{python} -c {shlex.quote(code)}")
    assert cmd.rc == 0, cmd.stderr
    return cmd.stdout.strip()


def test_current_points_at_release_b(host):
    current = host.file(f"{ROOT}/current")
    assert current.is_symlink
    assert current.linked_to == f"{ROOT}/venvs/molecule-b"


def test_previous_points_at_release_a(host):
    previous = host.file(f"{ROOT}/previous")
    assert previous.is_symlink
    assert previous.linked_to.startswith(f"{ROOT}/venvs/0.5.23-test-minimal-")


def test_release_a_kept_and_old_ones_pruned(host):
    releases = _releases(host)
    assert "molecule-b" in releases
    assert "old-1" not in releases
    assert "old-2" not in releases
    assert len([r for r in releases if r.startswith("0.5.23-test-minimal-")]) == 1, releases
    assert len(releases) == 2, releases


def test_no_temporary_symlinks_left(host):
    # ansible.builtin.file state=link renames a temporary link (.<pid>.<time>.tmp) over the old one.
    left = host.check_output(f"find {ROOT} -mindepth 1 -maxdepth 1 -name '.*' -printf '%f\\n'").split()
    assert left == [], left


def test_release_b_passed_its_venv_check(host):
    out = host.run(f"{ROOT}/venvs/molecule-b/bin/python {ROOT}/venvs/molecule-b/.hicache-fleet-venv-check.py "
                   + shlex.quote(json.dumps({"torch_build": "any"})))
    assert out.rc == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["problems"] == []


@pytest.mark.parametrize("link", ["current", "previous"])
def test_release_reports_pinned_sglang_on_cpu_torch(host, link):
    out = _run_python(
        host,
        f"{ROOT}/{link}/bin/python",
        "import json, sglang, torch; print(json.dumps({'v': sglang.__version__, 't': torch.__version__}))",
    )
    versions = json.loads(out.splitlines()[-1])
    assert versions["v"] == "0.5.23"
    assert versions["t"].startswith("2.13.0")


def test_prepare_server_args_parses_a_launch_line(host):
    code = (
        "from sglang.srt.server_args import prepare_server_args\n"
        "a = prepare_server_args(['--model-path', '/models/m', '--enable-hierarchical-cache',"
        " '--hicache-size', '4', '--hicache-write-policy', 'write_back'])\n"
        "print(a.enable_hierarchical_cache, a.hicache_size, a.hicache_write_policy)"
    )
    out = _run_python(host, f"{ROOT}/current/bin/python", code)
    assert out.splitlines()[-1] == "True 4 write_back"


def test_prepare_server_args_rejects_a_bad_choice(host):
    code = (
        "from sglang.srt.server_args import prepare_server_args\n"
        "prepare_server_args(['--model-path', '/m', '--hicache-write-policy', 'foo'])"
    )
    cmd = host.run(f"{ROOT}/current/bin/python -c {shlex.quote(code)}")
    assert cmd.rc == 2
    assert "invalid choice: 'foo'" in cmd.stderr


@pytest.mark.parametrize("path", [ROOT, f"{ROOT}/venvs", f"{ROOT}/venvs/molecule-b"])
def test_ownership_and_modes(host, path):
    d = host.file(path)
    assert d.is_directory
    assert d.user == "root"
    assert d.group == "root"
    assert d.mode == 0o755


def test_nothing_in_the_venv_is_world_writable(host):
    out = host.check_output(f"find {ROOT}/venvs -perm -o+w ! -type l -print -quit")
    assert out == ""


def test_package_hash_recorded(host):
    marker = host.file(f"{ROOT}/venvs/molecule-b/.hicache-fleet-packages.sha256")
    assert marker.is_file
    assert len(marker.content_string.strip()) == 64
    spec = json.loads(host.file(f"{ROOT}/venvs/molecule-b/.hicache-fleet-packages.json").content_string)
    assert spec["package_set"] == "test-minimal"
    assert spec["require_hashes"], "release B was installed in hash-checking mode"
    assert any(line.split()[1].startswith("sglang-0.5.23-") for line in spec["wheelhouse"])


def test_release_b_installed_from_the_lock_file(host):
    lock = host.file(f"{ROOT}/venvs/molecule-b/.hicache-fleet-requirements.lock.txt")
    assert lock.is_file
    assert "sglang==0.5.23 --hash=sha256:" in lock.content_string


def test_copied_wheelhouse_removed(host):
    assert not host.file(f"{ROOT}/wheelhouse").exists


def test_simulator_installed_when_packaged(host):
    if not SIM:
        pytest.skip("sim/ is not a package in this checkout yet")
    cmd = host.run(f"{ROOT}/current/bin/python -m pip show sglang-sim")
    assert cmd.rc == 0, cmd.stderr
