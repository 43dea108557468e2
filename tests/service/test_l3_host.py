"""The L3 tier on a host (issue 27, item 1), with real Ansible on localhost in a temporary directory:

- the role's own task (tasks/user.yml, "User | L3 tier directories") makes <l3_dir> and <l3_dir>/<name>
  root's 0755 and the identity's directory the service user's 0700: the owner reads it, another user
  (not even root's group mates) cannot list it;
- the `prune` entry point keeps the identity directories of the current plan and of the release the
  `current` pointer names, removes the rest (also a kept or protected release's, whose files stay), and
  in check mode removes nothing but says so.

The service user here is `nobody` (an account every Debian host has); the role's user tasks that
would create or change an account are not run.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
USER_TASKS = ROOT / "roles" / "sglang_service" / "tasks" / "user.yml"
L3_TASK = "User | L3 tier directories (the identity's is the service's, 0700)"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/sbin/runuser").exists(),
                                reason="needs root (chown) and runuser")


def _play(work: Path, playbook: list, extra: dict, *args: str) -> subprocess.CompletedProcess:
    (work / "play.yml").write_text(yaml.safe_dump(playbook, sort_keys=False), encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_FACT_CACHING="memory", ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(work / "play.yml"),
         "-e", json.dumps({"ansible_python_interpreter": sys.executable, **extra}), *args],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )


def _vars(tmp_path: Path) -> dict:
    return {"sglang_service_model_path": "/srv/models/main", "sglang_service_draft_model_path": "/srv/models/draft",
            "sglang_service_state_dir": str(tmp_path / "state"), "sglang_service_l3_dir": str(tmp_path / "l3"),
            "sglang_service_l3_enabled": True, "sglang_service_l3_max_size_gb": 1,
            "sglang_service_user": "nobody", "sglang_service_group": "nogroup",
            "sglang_service_instances": [{"name": "main", "port": 30987}]}


@pytest.fixture
def open_tmp():
    """A directory every user may traverse (pytest's own tmp dirs are 0700), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="l3-host-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_the_identity_directory_is_the_service_users_alone(open_tmp):
    tmp_path = open_tmp
    task = next(t for t in yaml.safe_load(USER_TASKS.read_text()) if t.get("name") == L3_TASK)
    playbook = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": "sglang_service", "tasks_from": "plan.yml", "public": True}},
        {**task, "vars": {"role_path": str(ROOT / "roles" / "sglang_service")}},
        {"ansible.builtin.debug": {"msg": "L3DIR={{ _sglang_service_plan[0].l3.dir }}"}},
    ]}]
    run = _play(tmp_path, playbook, _vars(tmp_path))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    directory = Path(re.search(r"L3DIR=(/[^\s\"']+)", run.stdout).group(1))
    assert directory.parent.parent == tmp_path / "l3"
    nobody = pwd.getpwnam("nobody").pw_uid
    for path, uid, mode in ((tmp_path / "l3", 0, 0o755), (directory.parent, 0, 0o755), (directory, nobody, 0o700)):
        stat = path.stat()
        assert (stat.st_uid, stat.st_mode & 0o7777) == (uid, mode), path
    owner = subprocess.run(["/usr/sbin/runuser", "-u", "nobody", "--", "ls", "-a", str(directory)],
                           capture_output=True, text=True, check=False)
    assert owner.returncode == 0, owner.stderr
    other = subprocess.run(["/usr/sbin/runuser", "-u", "daemon", "--", "ls", str(directory)],
                           capture_output=True, text=True, check=False)
    assert other.returncode != 0
    assert "Permission denied" in other.stderr


def test_prune_keeps_the_identities_of_the_running_and_protected_releases_and_removes_the_rest(tmp_path):
    variables = _vars(tmp_path)
    plan_only = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": "sglang_service", "tasks_from": "plan.yml"}},
        {"ansible.builtin.debug": {"msg": "L3DIR={{ _sglang_service_plan[0].l3.dir }}"}},
    ]}]
    run = _play(tmp_path, plan_only, variables)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    planned = Path(re.search(r"L3DIR=(/[^\s\"']+)", run.stdout).group(1))
    base = tmp_path / "l3" / "main"
    kept_a, kept_b, unused = base / "aaaaaaaaaaaaaaaa", base / "bbbbbbbbbbbbbbbb", base / "cccccccccccccccc"
    previous = base / "dddddddddddddddd"
    for directory in (planned, kept_a, kept_b, unused, previous):
        directory.mkdir(parents=True)
        (directory / "page.bin").write_bytes(b"kv")
    releases = tmp_path / "state" / "main" / "releases"
    # 111: the current pointer's (kept); 222: protected, as the rollout passes an earlier validated one,
    # and 444: a kept release (their files stay, their cache pages go).
    variables = {**variables, "sglang_service_releases_protect": ["222222222222" * 5 + "2222"]}
    for release, l3 in (("111111111111", kept_a), ("222222222222", kept_b), ("333333333333", None),
                        ("444444444444", previous)):
        (releases / release).mkdir(parents=True)
        record = {"name": "main", "config_hash": release * 5 + release[:4], "release_dir": str(releases / release)}
        if l3:
            record["l3"] = {"dir": str(l3), "id": l3.name}
        (releases / release / "release.json").write_text(json.dumps(record), encoding="utf-8")
    (tmp_path / "state" / "main" / "current").symlink_to(releases / "111111111111")
    prune = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": "sglang_service", "tasks_from": "prune"}},
    ]}]

    dry = _play(tmp_path, prune, variables, "--check", "--diff")
    assert dry.returncode == 0, dry.stdout[-4000:] + dry.stderr[-2000:]
    # One module call: --diff lists each directory that would go as a removed line.
    would_go = set(re.findall(r"^-(/\S+)$", dry.stdout, re.MULTILINE))
    assert {str(unused), str(previous), str(kept_b)} <= would_go, dry.stdout[-4000:]
    assert not {str(planned), str(kept_a)} & would_go, dry.stdout[-4000:]
    assert all(d.exists() for d in (planned, kept_a, kept_b, unused, previous))

    real = _play(tmp_path, prune, variables)
    assert real.returncode == 0, real.stdout[-4000:] + real.stderr[-2000:]
    assert not unused.exists()
    assert not previous.exists()
    assert not kept_b.exists()
    assert all((d / "page.bin").exists() for d in (planned, kept_a))
    assert sorted(p.name for p in releases.iterdir()) == ["111111111111", "222222222222", "333333333333",
                                                          "444444444444"]
