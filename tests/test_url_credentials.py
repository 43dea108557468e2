"""Issue 24: a mirror URL with user:password@ is recorded without it. The rocm role's `release`
entry point (controller-side: the desired release, a cacheable fact) runs at -v with the fact cache
of ansible.cfg (jsonfile) in tmp: the password is neither printed nor in the cache, and the release
names the mirror without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "pw-Mirror-8Kq"  # noqa: S105 (a test password)

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.include_role: {name: rocm, tasks_from: release}
"""


def test_the_rocm_release_fact_and_the_fact_cache_hold_no_mirror_password(tmp_path):
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    cache = tmp_path / "facts"
    variables = {"ansible_python_interpreter": sys.executable, "rocm_source": "amd", "rocm_version": "7.2.1",
                 "rocm_amd_suite": "noble",
                 "rocm_amd_repo_base_url": f"https://bob:{PASSWORD}@127.0.0.4:9/radeon"}
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_FACT_CACHING="jsonfile", ANSIBLE_CACHE_PLUGIN_CONNECTION=str(cache), ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-v", "-i", "mirrorhost,", "-c", "local",
         str(tmp_path / "play.yml"), "-e", json.dumps(variables)],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert PASSWORD not in run.stdout + run.stderr
    (cached_file,) = cache.glob("*mirrorhost")  # ansible.cfg's fact_caching_prefix, if any
    cached = cached_file.read_text()  # ansible-core 2.19's tagged JSON: read as text
    assert "rocm_release" in cached
    assert PASSWORD not in cached
    assert "bob" not in cached
    for uri in ("https://127.0.0.4:9/radeon/rocm/apt/7.2.1", "https://127.0.0.4:9/radeon/graphics/7.2.1/ubuntu",
                "https://127.0.0.4:9/radeon/amdgpu/30.30.1/ubuntu"):
        assert uri in cached
        assert uri in run.stdout


VENV_PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.include_role: {name: sglang_venv, tasks_from: settings}
    - ansible.builtin.include_role: {name: sglang_venv, tasks_from: resolve}
    - ansible.builtin.copy:
        content: "{{ {'steps': _sglang_venv_steps, 'set': _sglang_venv_set, 'settings': sglang_venv_settings,
                      'netrc': _sglang_venv_index_auth.netrc} | to_json }}"
        dest: "{{ out }}/steps.json"
        mode: "0600"
      no_log: true
"""


def test_the_venv_steps_hold_no_index_password_and_pip_gets_it_in_a_netrc_text(tmp_path):
    """The steps, the set and the settings fact (all printed at -v, and pip's argv is built from the
    steps) hold the index URL without user:password@; the credentials are only in the netrc text
    (no_log), percent-decoded as pip decodes a URL's userinfo."""
    (tmp_path / "play.yml").write_text(VENV_PLAYBOOK)
    variables = {"ansible_python_interpreter": sys.executable, "out": str(tmp_path),
                 "sglang_venv_package_set": "rocm-gfx1100",
                 "sglang_venv_rocm_torch_index_url": f"https://bob:{PASSWORD}%40x@127.0.0.5:9/rocm"}
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_FACT_CACHING="memory", ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-v", "-i", "venvhost,", "-c", "local",
         str(tmp_path / "play.yml"), "-e", json.dumps(variables)],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert PASSWORD not in run.stdout + run.stderr
    assert "Settings | the package set and the package sets" in run.stdout
    facts = json.loads((tmp_path / "steps.json").read_text())
    assert facts["steps"][0]["index_url"] == "https://127.0.0.5:9/rocm"
    assert PASSWORD not in json.dumps([facts["steps"], facts["set"], facts["settings"]])
    assert facts["set"]["lock"]["torch_find_links"] == "https://127.0.0.5:9/rocm"
    assert facts["netrc"] == f"machine 127.0.0.5 login bob password {PASSWORD}@x\n"


ROUTER_PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.include_role: {name: rollout_router, tasks_from: check}
"""


def test_a_router_url_with_a_password_is_refused_without_repeating_it(tmp_path):
    """rollout_router_url = http://user:password@...: the rollout's router check (its first router task)
    refuses it before any request, naming the variable, and the password is not printed at -v."""
    (tmp_path / "play.yml").write_text(ROUTER_PLAYBOOK)
    variables = {"ansible_python_interpreter": sys.executable,
                 "rollout_router_url": f"http://ops:{PASSWORD}@127.0.0.4:9"}
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_FACT_CACHING="memory", ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-v", "-i", "routerhost,", "-c", "local",
         str(tmp_path / "play.yml"), "-e", json.dumps(variables)],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )
    said = run.stdout + run.stderr
    assert run.returncode != 0, said[-3000:]
    assert ('rollout_router_url="http://127.0.0.4:9" is not a router base URL without credentials'
            in " ".join(said.split()))
    assert "Router | it lists its workers" not in said
    assert PASSWORD not in said
