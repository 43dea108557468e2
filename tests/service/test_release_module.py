"""Staging a release as one module call: module_utils/sglang_service_release.py on tmp_path, the
filter that feeds it, and library/sglang_service_release.py through `ansible localhost -m` (AnsiballZ,
check mode, no_log) as the role's stage runs it."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import ansible.module_utils
import pytest
from ansible.plugins.filter.core import to_nice_json
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))

from ansible.module_utils import sglang_service_release as release  # noqa: E402

filters = load("roles/sglang_service/filter_plugins/sglang_service.py", "sglang_service_filters_release_module")
SECRET = '{\n    "api-key": "sk-test-5e1f0c9a77"\n}'  # noqa: S105 (a test key)


def _instance(tmp_path: Path, name: str = "main", unit: str = "[Unit]\nDescription=x\n") -> dict:
    live = tmp_path / "live"
    live.mkdir(exist_ok=True)
    return {
        "name": name,
        "unit_path": str(live / f"sglang-{name}.service"),
        "env_path": str(live / f"{name}.env"),
        "secrets_path": str(live / f"{name}.secrets.yaml"),
        "release_dir": str(tmp_path / "state" / name / "releases" / "0123456789ab"),
        "unit": unit,
        "argv_json": '[\n    "--port",\n    "30000"\n]\n',
        "release_json": '{\n    "name": "main"\n}\n',
    }


def _live(instance: dict, unit: str | None, env: str | None, secrets: str | None = None) -> None:
    for key, text in (("unit_path", unit), ("env_path", env), ("secrets_path", secrets)):
        path = Path(instance[key])
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)


def test_live_differs_names_what_a_restart_would_change(tmp_path):
    inst = _instance(tmp_path)
    _live(inst, inst["unit"], "A=1\n")
    assert not release.live_differs(inst, "A=1\n", "")
    assert release.live_differs(inst, "A=2\n", "")  # env changed (e.g. a ROCm variable)
    _live(inst, "[Unit]\nold\n", "A=1\n")
    assert release.live_differs(inst, "A=1\n", "")  # unit changed
    _live(inst, None, None)
    assert release.live_differs(inst, "A=1\n", "")  # first deploy


def test_live_differs_holds_the_secrets_file_to_the_keys(tmp_path):
    inst = _instance(tmp_path)
    _live(inst, inst["unit"], "A=1\n", SECRET)
    assert not release.live_differs(inst, "A=1\n", SECRET)
    assert release.live_differs(inst, "A=1\n", SECRET.replace("5e1f", "ffff"))  # a key rotated
    assert release.live_differs(inst, "A=1\n", "")  # keys removed: the file must go
    _live(inst, inst["unit"], "A=1\n", None)
    assert not release.live_differs(inst, "A=1\n", "")
    assert release.live_differs(inst, "A=1\n", SECRET)  # keys added


def test_stage_writes_the_release_once_with_tight_modes(tmp_path):
    inst = _instance(tmp_path)
    _live(inst, inst["unit"], "A=1\n")
    first = release.stage([inst], {"main": "A=2\n"}, {}, check_mode=False)
    release_dir = Path(inst["release_dir"])
    assert first["changed"]
    assert first["pending"] == ["main"]
    assert sorted(p.name for p in release_dir.iterdir()) == ["argv.json", "env", "release.json", "unit"]
    assert stat.S_IMODE(release_dir.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in release_dir.iterdir()} == {0o600}
    assert (release_dir / "env").read_text() == "A=2\n"
    assert (release_dir / "unit").read_text() == inst["unit"]
    # The same release again: nothing written; the live env still differs, so still pending.
    again = release.stage([inst], {"main": "A=2\n"}, {}, check_mode=False)
    assert again["pending"] == ["main"]
    assert again["written"] == []
    assert not again["changed"]
    # A file of the release changed by hand, or its mode: put back, and only that file.
    (release_dir / "argv.json").write_text("[]\n")
    os.chmod(release_dir / "env", 0o644)
    fixed = release.stage([inst], {"main": "A=2\n"}, {}, check_mode=False)
    assert sorted(Path(p).name for p in fixed["written"]) == ["argv.json", "env"]
    assert stat.S_IMODE((release_dir / "env").stat().st_mode) == 0o600
    assert not list(release_dir.glob(".staging-*"))


def test_stage_keeps_secrets_only_for_an_instance_with_keys(tmp_path):
    keyed, plain = _instance(tmp_path, "keyed"), _instance(tmp_path, "plain")
    for inst in (keyed, plain):
        _live(inst, inst["unit"], "A=1\n")
    result = release.stage([keyed, plain], {"keyed": "A=1\n", "plain": "A=1\n"}, {"keyed": SECRET, "plain": ""},
                           check_mode=False)
    assert result["pending"] == ["keyed"]  # its live secrets file is missing
    assert (Path(keyed["release_dir"]) / "secrets.yaml").read_text() == SECRET
    assert not (Path(plain["release_dir"]) / "secrets.yaml").exists()
    assert all("secrets.yaml" not in p or p.startswith(keyed["release_dir"]) for p in result["written"])


def test_check_mode_writes_nothing_and_says_what_it_would(tmp_path):
    inst = _instance(tmp_path)
    result = release.stage([inst], {"main": "A=1\n"}, {}, check_mode=True)
    assert result["changed"]
    assert result["pending"] == ["main"]
    assert inst["release_dir"] in result["written"]
    assert not Path(inst["release_dir"]).exists()


def test_a_file_where_the_release_directory_goes_is_refused(tmp_path):
    inst = _instance(tmp_path)
    Path(inst["release_dir"]).parent.mkdir(parents=True)
    Path(inst["release_dir"]).write_text("not a directory")
    with pytest.raises(ValueError, match="is not a directory"):
        release.stage([inst], {}, {}, check_mode=False)


def test_the_filter_renders_the_release_files_as_to_nice_json_did():
    plan = [{
        "name": "main", "unit": "sglang-main.service", "unit_path": "/etc/systemd/system/sglang-main.service",
        "env_path": "/etc/sglang/main.env", "secrets_path": "/etc/sglang/main.secrets.yaml",
        "release_dir": "/var/lib/sglang/main/releases/0123456789ab", "unit_content": "[Unit]\n",
        "launch_argv": ["--model-path", "/srv/models/é", "--port", "30000"], "bind": "127.0.0.1", "port": "30000",
        "config_hash": "f" * 64, "args": {"--model-path": "/srv/models/é"}, "components": {"rocm": "a"},
        "state_dir": "/var/lib/sglang/main", "releases_dir": "/var/lib/sglang/main/releases",
        "staging_dir": "/run/sglang-staging/main", "check_argv": ["--port", "30000"],
    }]
    (out,) = filters.release_instances(plan, "/opt/sglang/venvs/r1/bin/python")
    # What the copy tasks wrote before: "{{ x | to_nice_json }}\n".
    assert out["argv_json"] == to_nice_json(plan[0]["launch_argv"]) + "\n"
    python = "/opt/sglang/venvs/r1/bin/python"
    assert out["release_json"] == to_nice_json(filters.release_record(plan[0], python)) + "\n"
    assert out["unit"] == "[Unit]\n"
    assert out["release_dir"] == plan[0]["release_dir"]
    assert "env" not in out
    assert "secrets" not in out
    assert (out["unit_name"], out["port"], out["state_dir"]) == ("sglang-main.service", 30000, "/var/lib/sglang/main")


def _ansible(tmp_path: Path, args: dict, *extra: str) -> subprocess.CompletedProcess:
    argv = [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-m", "sglang_service_release",
            "-a", json.dumps(args), "-v", *extra]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False)


def test_the_module_through_ansible_check_mode_then_real_then_unchanged(tmp_path):
    inst = _instance(tmp_path)
    _live(inst, inst["unit"], "A=1\n", SECRET)
    args = {"instances": [inst], "env": {"main": "A=1\nB=2\n"}, "secrets": {"main": SECRET}}
    checked = _ansible(tmp_path, args, "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "CHANGED" in checked.stdout
    assert not Path(inst["release_dir"]).exists()
    done = _ansible(tmp_path, args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'pending:\n    - main' in done.stdout, done.stdout  # the env differs from the live one
    assert (Path(inst["release_dir"]) / "secrets.yaml").read_text() == SECRET
    again = _ansible(tmp_path, args)
    assert again.returncode == 0, again.stdout
    assert "CHANGED" not in again.stdout, again.stdout
    # The keys are not printed, even with -v.
    for out in (checked, done, again):
        assert "sk-test-5e1f0c9a77" not in out.stdout + out.stderr
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    assert digest not in done.stdout


def test_the_module_names_a_relative_release_dir(tmp_path):
    inst = {**_instance(tmp_path), "release_dir": "releases/x"}
    out = _ansible(tmp_path, {"instances": [inst]})
    assert out.returncode != 0, out.stdout
    assert "release_dir 'releases/x' is not an absolute path" in out.stdout, out.stdout


# --- state=active: the staged release becomes the live one ---------------------------------------


def _active(tmp_path: Path, name: str = "main", release: str = "0123456789ab", unit: str = "[Unit]\nnew\n") -> dict:
    inst = _instance(tmp_path, name, unit)
    state_dir = tmp_path / "state" / name
    inst.update(release_dir=str(state_dir / "releases" / release), state_dir=str(state_dir),
                releases_dir=str(state_dir / "releases"), unit_name=f"sglang-{name}.service", bind="127.0.0.1",
                port=30000)
    Path(inst["release_dir"]).mkdir(parents=True, exist_ok=True)
    return inst


def _mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_activate_a_first_release_installs_it_and_restarts(tmp_path):
    inst = _active(tmp_path)
    out = release.activate([inst], {"main": "A=1\n"}, {}, ["main"], check_mode=False)
    assert out["restart"] == ["main"]
    assert out["units_changed"]
    assert Path(inst["unit_path"]).read_text() == inst["unit"]
    assert (_mode(inst["unit_path"]), _mode(inst["env_path"])) == (0o644, 0o600)
    assert os.readlink(Path(inst["state_dir"]) / "current") == inst["release_dir"]
    assert not (Path(inst["state_dir"]) / "previous").exists()
    assert not Path(inst["secrets_path"]).exists()
    # The same again: nothing changes, nothing restarts.
    again = release.activate([inst], {"main": "A=1\n"}, {}, [], check_mode=False)
    assert again["restart"] == []
    assert not again["changed"]


def test_activate_moves_current_to_previous_only_for_a_changing_instance(tmp_path):
    old = _active(tmp_path, release="aaaaaaaaaaaa", unit="[Unit]\nold\n")
    release.activate([old], {"main": "A=1\n"}, {}, ["main"], check_mode=False)
    new = _active(tmp_path, release="bbbbbbbbbbbb")
    out = release.activate([new], {"main": "A=1\n"}, {}, ["main"], check_mode=False)
    state = Path(new["state_dir"])
    assert os.readlink(state / "previous") == old["release_dir"]
    assert os.readlink(state / "current") == new["release_dir"]
    assert out["restart"] == ["main"]  # the unit changed
    # Not in `changing`: previous stays where it is (a re-activation never loses the rollback target).
    third = _active(tmp_path, release="cccccccccccc")
    release.activate([third], {"main": "A=1\n"}, {}, [], check_mode=False)
    assert os.readlink(state / "previous") == old["release_dir"]


def test_a_state_dir_reached_through_a_symlink_keeps_its_rollback_target(tmp_path):
    """/var/lib may be a symlink on a host: the same release activated again (its env changed) must not
    become its own `previous`; the release before it stays the rollback target."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    old = _active(tmp_path / "link", release="aaaaaaaaaaaa", unit="[Unit]\nold\n")
    release.activate([old], {"main": "A=1\n"}, {}, ["main"], check_mode=False)
    new = _active(tmp_path / "link", release="bbbbbbbbbbbb")
    release.activate([new], {"main": "A=1\n"}, {}, ["main"], check_mode=False)
    state = Path(new["state_dir"])
    assert os.path.realpath(state / "previous") == os.path.realpath(old["release_dir"])
    out = release.activate([new], {"main": "A=2\n"}, {}, ["main"], check_mode=False)
    assert out["restart"] == ["main"]
    assert os.path.realpath(state / "previous") == os.path.realpath(old["release_dir"])
    assert os.readlink(state / "current") == new["release_dir"]


def test_activate_adopts_a_unit_the_role_did_not_install(tmp_path):
    inst = _active(tmp_path)
    _live(inst, "[Unit]\nhand-made\n", "B=2\n")
    release.activate([inst], {"main": "A=1\n"}, {}, ["main"], check_mode=False)
    unit_sum = hashlib.sha256(b"[Unit]\nhand-made\n").hexdigest()
    adopted = Path(inst["releases_dir"]) / f"adopted-{unit_sum[:12]}"
    assert os.readlink(Path(inst["state_dir"]) / "previous") == str(adopted)
    assert (adopted / "unit").read_text() == "[Unit]\nhand-made\n"
    assert (adopted / "env").read_text() == "B=2\n"
    assert not (adopted / "secrets.yaml").exists()
    record = json.loads((adopted / "release.json").read_text())
    assert record == {"name": "main", "unit": "sglang-main.service", "bind": "127.0.0.1", "port": 30000,
                      "profile": "adopted", "config_hash": f"adopted-{unit_sum}"}
    assert (adopted / "release.json").read_text() == to_nice_json(record) + "\n"


def test_activate_writes_the_keys_root_only_and_removes_them_when_gone(tmp_path):
    inst = _active(tmp_path)
    # A file left group-readable by an older release is tightened (and the instance restarts).
    _live(inst, None, None, SECRET)
    os.chmod(inst["secrets_path"], 0o640)
    owner = (os.geteuid(), os.getegid())
    out = release.activate([inst], {"main": "A=1\n"}, {"main": SECRET}, ["main"], check_mode=False,
                           owner=owner, want_diff=True)
    assert Path(inst["secrets_path"]).read_text() == SECRET
    # The unit loads it as a credential: no user or group but root's needs to read the file.
    assert _mode(inst["secrets_path"]) == 0o600
    assert (os.stat(inst["secrets_path"]).st_uid, os.stat(inst["secrets_path"]).st_gid) == owner
    assert inst["secrets_path"] in out["changed_paths"]
    assert all(SECRET not in d["after"] for d in out["diff"])
    assert sorted(d["after_header"] for d in out["diff"]) == sorted([inst["env_path"], inst["unit_path"]])
    gone = release.activate([inst], {"main": "A=1\n"}, {"main": ""}, ["main"], check_mode=False)
    assert gone["restart"] == ["main"]  # the keys went: SGLang must restart without them
    assert not Path(inst["secrets_path"]).exists()


def test_activate_in_check_mode_writes_nothing_and_says_what_restarts(tmp_path):
    inst = _active(tmp_path)
    _live(inst, "[Unit]\nold\n", "A=1\n")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    out = release.activate([inst], {"main": "A=2\n"}, {"main": SECRET}, ["main"], check_mode=True, want_diff=True)
    assert out["restart"] == ["main"]
    assert out["changed"]
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert Path(inst["unit_path"]).read_text() == "[Unit]\nold\n"
    assert {d["after_header"]: (d["before"], d["after"]) for d in out["diff"]}[inst["env_path"]] == ("A=1\n", "A=2\n")


def test_the_module_activates_through_ansible_with_a_truthful_diff(tmp_path):
    inst = _active(tmp_path)
    _live(inst, "[Unit]\nold\n", "A=1\n")
    args = {"state": "active", "instances": [inst], "env": {"main": "A=1\nHIP_VISIBLE_DEVICES=0,1\n"},
            "secrets": {"main": SECRET}, "changing": ["main"]}
    checked = _ansible(tmp_path, args, "--check", "--diff")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "-[Unit]\n-old" not in checked.stdout
    assert "-old\n+new" in checked.stdout  # the unit's diff
    assert "+HIP_VISIBLE_DEVICES=0,1" in checked.stdout  # the env file's (it holds no keys)
    assert Path(inst["unit_path"]).read_text() == "[Unit]\nold\n"
    done = _ansible(tmp_path, args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "restart:\n    - main" in done.stdout, done.stdout
    assert Path(inst["unit_path"]).read_text() == inst["unit"]
    assert _mode(inst["secrets_path"]) == 0o600
    if os.geteuid() == 0:  # the module sets owners when it runs as root: root:root, whatever the group
        st = os.stat(inst["secrets_path"])
        assert (st.st_uid, st.st_gid) == (0, 0)
    for out in (checked, done):
        assert "sk-test-5e1f0c9a77" not in out.stdout + out.stderr
    missing = _ansible(tmp_path, {"state": "active", "instances": [_instance(tmp_path)]})
    assert missing.returncode != 0
    assert "state=active needs state_dir, releases_dir, unit_name, bind, port" in missing.stdout, missing.stdout


def test_the_directories_come_in_creation_order_with_their_owners():
    plan = [{"state_dir": "/var/lib/sglang/a", "releases_dir": "/var/lib/sglang/a/releases",
             "home_dir": "/var/lib/sglang/a/home"}]
    dirs = filters.directories(plan, "/etc/sglang", "/var/lib/sglang", "/usr/local/libexec/sglang", "sglang", "sglang")
    assert [d["path"] for d in dirs] == ["/etc/sglang", "/var/lib/sglang", "/usr/local/libexec/sglang",
                                          "/var/lib/sglang/a", "/var/lib/sglang/a/releases", "/var/lib/sglang/a/home"]
    assert [(d["owner"], d["mode"]) for d in dirs[3:]] == [("root", "0755"), ("root", "0700"), ("sglang", "0750")]
    assert all(d["owner"] == "root" and d["group"] == "root" for d in dirs[:5])


def test_scratch_writes_the_candidate_for_the_checks_also_in_check_mode(tmp_path):
    inst = {**_instance(tmp_path), "staging_dir": str(tmp_path / "staging" / "main"),
            "unit_name": "sglang-main.service", "check_argv_json": '["--config", "x/secrets.yaml"]\n',
            "state_dir": str(tmp_path / "state" / "main")}
    written = release.scratch([inst], {"main": "A=1\n"}, {"main": SECRET})
    staging = Path(inst["staging_dir"])
    assert sorted(p.name for p in staging.iterdir()) == ["argv.json", "main.env", "secrets.yaml", "sglang-main.service"]
    assert _mode(str(staging)) == 0o700
    assert _mode(str(staging / "sglang-main.service")) == 0o644
    assert {_mode(str(staging / n)) for n in ("argv.json", "main.env", "secrets.yaml")} == {0o600}
    assert len(written) == 4
    assert release.scratch([inst], {"main": "A=1\n"}, {"main": SECRET}) == []
    # The keys removed from the instance: the scratch copy of the old ones goes too.
    assert release.scratch([inst], {"main": "A=1\n"}, {}) == [str(staging / "secrets.yaml")]
    assert not (staging / "secrets.yaml").exists()
    out = _ansible(tmp_path, {"state": "scratch", "instances": [{**inst, "unit": "[Unit]\nchanged\n"}]}, "--check")
    assert out.returncode == 0, out.stdout
    assert "CHANGED" not in out.stdout  # scratch files are never a change
    assert (staging / "sglang-main.service").read_text() == "[Unit]\nchanged\n"  # written in check mode too


def test_scratch_reads_the_release_each_instance_runs_and_whether_the_interpreter_runs(tmp_path):
    """verify.yml's two reads, folded into render's module call: what `current` resolves to (as the
    stat module's lnk_source, the real path; '' without a link) and whether the python can run."""
    state = tmp_path / "state"
    (state / "main" / "releases" / "0123456789ab").mkdir(parents=True)
    (state / "other").mkdir(parents=True)
    (state / "main" / "current").symlink_to("releases/0123456789ab")
    found = release.current_releases([{"name": "main", "state_dir": str(state / "main")},
                                      {"name": "other", "state_dir": str(state / "other")}])
    assert found == {"main": str(state / "main" / "releases" / "0123456789ab"), "other": ""}
    python = tmp_path / "venv" / "bin" / "python"
    assert release.interpreter(str(python)) == {"path": str(python), "exists": False, "executable": False}
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o644)
    assert release.interpreter(str(python)) == {"path": str(python), "exists": True, "executable": False}
    python.chmod(0o755)
    link = tmp_path / "current-python"
    link.symlink_to(python)
    assert release.interpreter(str(link)) == {"path": str(link), "exists": True, "executable": True}
    python.unlink()
    assert release.interpreter(str(link))["exists"] is False  # a dangling link: no interpreter
    inst = {**_instance(tmp_path), "staging_dir": str(tmp_path / "staging" / "main"),
            "unit_name": "sglang-main.service", "check_argv_json": "[]\n", "state_dir": str(state / "main")}
    out = _ansible(tmp_path, {"state": "scratch", "instances": [inst], "python": str(link)}, "--check")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"main: {state / 'main' / 'releases' / '0123456789ab'}" in out.stdout, out.stdout
    assert "executable: false" in out.stdout, out.stdout


def test_the_filter_renders_the_parser_argv_as_to_json_did():
    from ansible.plugins.filter.core import to_json

    argv = ["--model-path", "/srv/m/é", "--config", "/run/x/secrets.yaml", "--port", "30000"]
    plan = [{"name": "m", "unit": "sglang-m.service", "unit_path": "/u", "env_path": "/e", "secrets_path": "/s",
             "release_dir": "/r", "unit_content": "", "launch_argv": argv, "check_argv": argv, "state_dir": "/st",
             "releases_dir": "/st/releases", "staging_dir": "/run/x", "bind": "::1", "port": 1}]
    (out,) = filters.release_instances(plan, "/v/bin/python")
    assert out["check_argv_json"] == to_json(argv) + "\n"


# --- rollback: the keys of the inventory now, never those of the release rolled back to ----------

OLD_KEY = '{\n    "api-key": "sk-old-rotated-out-41"\n}'
NEW_KEY = '{\n    "api-key": "sk-new-after-rotation-42"\n}'


def _rotated(tmp_path: Path, name: str = "main") -> tuple[dict, dict]:
    """Release A staged and activated with OLD_KEY, then release B with NEW_KEY (A is `previous`)."""
    first = _active(tmp_path, name, "aaaaaaaaaaaa", "[Unit]\nA\n")
    release.stage([first], {name: "A=1\n"}, {name: OLD_KEY}, check_mode=False)
    release.activate([first], {name: "A=1\n"}, {name: OLD_KEY}, [name], check_mode=False)
    second = _active(tmp_path, name, "bbbbbbbbbbbb", "[Unit]\nB\n")
    release.stage([second], {name: "A=1\n"}, {name: NEW_KEY}, check_mode=False)
    release.activate([second], {name: "A=1\n"}, {name: NEW_KEY}, [name], check_mode=False)
    assert os.readlink(Path(first["state_dir"]) / "previous") == first["release_dir"]
    return first, second


def test_a_rollback_after_a_key_rotation_keeps_the_new_key(tmp_path):
    first, _second = _rotated(tmp_path)
    out = release.rollback_secrets([first], {"main": NEW_KEY}, check_mode=False)
    assert out["kept"] == ["main"]
    assert Path(first["secrets_path"]).read_text() == NEW_KEY
    # Release A's unit reads the path itself (no LoadCredential line: staged before credentials),
    # as the service user: the file is put back group-readable as that release expects.
    assert _mode(first["secrets_path"]) == 0o640
    # The release rolled back to still holds the key of its time, root only (pruned with it).
    assert (Path(first["release_dir"]) / "secrets.yaml").read_text() == OLD_KEY
    assert _mode(str(Path(first["release_dir"]) / "secrets.yaml")) == 0o600
    again = release.rollback_secrets([first], {"main": NEW_KEY}, check_mode=False)
    assert again["changed"] is False


CREDENTIAL_UNIT = "[Service]\nExecStart=/py -m sglang --config %d/secrets.yaml\nLoadCredential=secrets.yaml:/etc/x\n"


def test_a_rollback_to_a_release_that_loads_the_credential_keeps_the_file_root_only(tmp_path):
    first = _active(tmp_path, "main", "aaaaaaaaaaaa", CREDENTIAL_UNIT)
    release.stage([first], {"main": "A=1\n"}, {"main": OLD_KEY}, check_mode=False)
    _live(first, "[Unit]\nB\n", "A=1\n", NEW_KEY)
    os.chmod(first["secrets_path"], 0o640)
    owner = (os.geteuid(), os.getegid())
    out = release.rollback_secrets([first], {"main": NEW_KEY}, check_mode=False, owner=owner, secrets_gid=12345)
    assert out["changed_paths"] == [first["secrets_path"]]
    assert _mode(first["secrets_path"]) == 0o600
    assert os.stat(first["secrets_path"]).st_gid == owner[1]  # not the service group
    assert Path(first["secrets_path"]).read_text() == NEW_KEY


@pytest.mark.parametrize(
    ("had", "now", "says"),
    [
        (OLD_KEY, "", "main: release aaaaaaaaaaaa was staged with api keys and the inventory sets none now"),
        ("", NEW_KEY, "main: release aaaaaaaaaaaa was staged without an api key and would serve without the key"),
    ],
)
def test_a_rollback_that_changes_whether_keys_are_served_is_refused_before_any_write(tmp_path, had, now, says):
    first = _active(tmp_path, "main", "aaaaaaaaaaaa")
    release.stage([first], {"main": "A=1\n"}, {"main": had}, check_mode=False)
    other = _active(tmp_path, "other", "cccccccccccc")
    release.stage([other], {"other": "A=1\n"}, {"other": NEW_KEY}, check_mode=False)
    _live(first, "[Unit]\nlive\n", "A=1\n", "live secrets of main\n")
    _live(other, "[Unit]\nlive\n", "A=1\n", "live secrets of other\n")
    with pytest.raises(release.RollbackRefused, match="rollback refused, nothing changed: ") as refused:
        release.rollback_secrets([other, first], {"main": now, "other": NEW_KEY}, check_mode=False)
    assert says in str(refused.value)
    assert "other" not in str(refused.value).split(": ", 1)[1].split(".")[0]  # the good one is not named
    # Nothing written, not even for the instance that was fine.
    assert Path(first["secrets_path"]).read_text() == "live secrets of main\n"
    assert Path(other["secrets_path"]).read_text() == "live secrets of other\n"
    assert "sk-" not in str(refused.value)


def test_the_module_rolls_back_secrets_without_printing_them(tmp_path):
    first, _second = _rotated(tmp_path)
    inst = {key: first[key] for key in ("name", "release_dir", "secrets_path", "unit_path", "env_path")}
    args = {"state": "rollback_secrets", "instances": [{**inst, "unit": ""}], "secrets": {"main": NEW_KEY},
            "service_group": "root"}
    done = _ansible(tmp_path, args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert Path(first["secrets_path"]).read_text() == NEW_KEY
    refused = _ansible(tmp_path, {**args, "secrets": {"main": ""}})
    assert refused.returncode != 0
    assert "rollback refused, nothing changed: main: release aaaaaaaaaaaa was staged with api keys" in refused.stdout
    assert Path(first["secrets_path"]).read_text() == NEW_KEY
    if os.geteuid() == 0:  # the group is looked up only when the module sets owners (as root)
        nogroup = _ansible(tmp_path, {**args, "service_group": "no-such-group-x9"})
        assert nogroup.returncode != 0
        assert "service_group 'no-such-group-x9' is not a group on this host" in nogroup.stdout, nogroup.stdout
    for out in (done, refused):
        assert "sk-new-after-rotation-42" not in out.stdout + out.stderr
        assert "sk-old-rotated-out-41" not in out.stdout + out.stderr


def test_the_rollback_filter_hands_the_module_each_instance_and_its_previous_release():
    previous = [{"item": {"name": "main", "secrets_path": "/etc/sglang/main.secrets.yaml", "unit_path": "/u",
                          "env_path": "/e", "unit": "sglang-main.service"},
                 "stat": {"islnk": True, "lnk_source": "/var/lib/sglang/main/releases/aaaaaaaaaaaa"}}]
    assert filters.rollback_instances(previous) == [
        {"name": "main", "release_dir": "/var/lib/sglang/main/releases/aaaaaaaaaaaa",
         "secrets_path": "/etc/sglang/main.secrets.yaml", "unit_path": "/u", "env_path": "/e", "unit": ""}]


# --- state=dropins: systemd drop-ins the toolkit did not write ------------------------------------


def _with_dropin_dirs(tmp_path: Path, name: str) -> dict:
    inst = _instance(tmp_path, name)
    units = tmp_path / "etc" / "systemd" / "system"
    run = tmp_path / "run" / "systemd" / "system"
    inst["dropin_dirs"] = [str(units / f"sglang-{name}.service.d"), str(units / "sglang-.service.d"),
                           str(run / f"sglang-{name}.service.d"), str(run / "sglang-.service.d")]
    return inst


def test_no_dropin_passes_and_changes_nothing(tmp_path):
    main, other = _with_dropin_dirs(tmp_path, "main"), _with_dropin_dirs(tmp_path, "other")
    Path(main["dropin_dirs"][0]).mkdir(parents=True)
    (Path(main["dropin_dirs"][0]) / "notes.txt").write_text("not a .conf\n")
    assert release.dropins([main, other], remove=False, check_mode=False) == {
        "instances": [], "removed": [], "changed": False}


def test_a_foreign_dropin_is_refused_naming_it_and_the_fix(tmp_path):
    main, other = _with_dropin_dirs(tmp_path, "main"), _with_dropin_dirs(tmp_path, "other")
    override = Path(main["dropin_dirs"][2]) / "override.conf"  # under /run
    override.parent.mkdir(parents=True)
    override.write_text("[Service]\nUser=root\n")
    with pytest.raises(release.DropinsRefused) as refused:
        release.dropins([main, other], remove=False, check_mode=False)
    text = str(refused.value)
    assert f"main: {override}" in text
    assert "other:" not in text
    assert "refused, nothing changed" in text
    assert "sglang_service_remove_foreign_dropins: true" in text
    assert override.exists()


def test_with_the_opt_in_the_dropins_are_removed_and_their_instances_restart(tmp_path):
    main, other = _with_dropin_dirs(tmp_path, "main"), _with_dropin_dirs(tmp_path, "other")
    own = Path(main["dropin_dirs"][0]) / "override.conf"
    shared = Path(main["dropin_dirs"][1]) / "10-all.conf"  # sglang-.service.d: every instance's
    for path in (own, shared):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("[Service]\nExecStartPre=+/bin/true\n")
    checked = release.dropins([main, other], remove=True, check_mode=True)  # stage: read only
    assert checked["instances"] == ["main", "other"]
    assert own.exists()
    assert shared.exists()
    done = release.dropins([main, other], remove=True, check_mode=False)
    assert done["instances"] == ["main", "other"]
    assert sorted(done["removed"]) == sorted([str(own), str(shared)])
    assert done["changed"] is True
    assert not own.exists()
    assert not shared.exists()
    assert release.dropins([main, other], remove=False, check_mode=False)["changed"] is False


def test_the_module_refuses_a_dropin_through_ansible(tmp_path):
    inst = _with_dropin_dirs(tmp_path, "main")
    override = Path(inst["dropin_dirs"][0]) / "override.conf"
    override.parent.mkdir(parents=True)
    override.write_text("[Service]\nUser=root\n")
    refused = _ansible(tmp_path, {"state": "dropins", "instances": [inst]})
    assert refused.returncode != 0
    assert f"main: {override}" in refused.stdout, refused.stdout
    assert override.exists()
    removed = _ansible(tmp_path, {"state": "dropins", "instances": [inst], "remove": True})
    assert removed.returncode == 0, removed.stdout
    assert not override.exists()
