"""library/fleet_release_state.py run for real on tmp_path: the module file under the venv's Python
with an args file, as Ansible runs it on a host (AnsibleModule reads {"ANSIBLE_MODULE_ARGS": ...}).
A fake `systemctl` on PATH plays the units; one test goes through `ansible localhost -m`."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODULE = REPO / "library" / "fleet_release_state.py"
VENV_BIN = REPO / ".venv" / "bin"
FINGERPRINT = "release-digest-5f3c9a1e77d04b2a"

# Prints one state per unit, as `systemctl is-active u1 u2 ...` does: "active" for the units listed
# in $FAKE_ACTIVE_UNITS, "inactive" for the others; rc 3 when any is not active.
FAKE_SYSTEMCTL = """\
#!/usr/bin/env bash
[ "$1" = is-active ] || { echo "fake systemctl: only is-active" >&2; exit 2; }
shift
rc=0
for unit in "$@"; do
  case " $FAKE_ACTIVE_UNITS " in
    *" $unit "*) echo active ;;
    *) echo inactive; rc=3 ;;
  esac
done
exit $rc
"""


class Host:
    """A fake host under tmp_path: a unit file, an env file with a secret, a model dir, the state dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.units_dir = root / "etc" / "systemd"
        self.units_dir.mkdir(parents=True)
        self.unit_file = self.units_dir / "sglang@a.service"
        self.unit_file.write_text("[Service]\nExecStart=/usr/bin/sglang --port 30000\n")
        self.env_file = self.units_dir / "sglang@a.env"
        self.env_file.write_text("SGLANG_API_KEY=sk-very-secret\n")
        self.model = root / "models" / "seed-27b"
        self.model.mkdir(parents=True)
        (self.model / "config.json").write_text('{"vocab_size": 32000}\n')
        (self.model / "weights").mkdir()
        (self.model / "weights" / "model-00001.safetensors").write_bytes(b"\0" * 4096)
        self.state = root / "var" / "lib" / "hicache-fleet"
        self.record = self.state / "converged.json"
        self.key = self.state / ".converged-key"
        self.bin = root / "bin"
        self.bin.mkdir()
        systemctl = self.bin / "systemctl"
        systemctl.write_text(FAKE_SYSTEMCTL)
        systemctl.chmod(0o755)
        self.active_units = ""

    def args(self, **over) -> dict:
        args = {
            "path": str(self.record),
            "fingerprint": FINGERPRINT,
            "files": [str(self.units_dir / "sglang@*.service"), str(self.units_dir / "*.env")],
            "trees": [str(self.model)],
        }
        args.update(over)
        return args

    def env(self, path: str | None = None) -> dict:
        env = dict(os.environ)
        env["PATH"] = path if path is not None else f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["FAKE_ACTIVE_UNITS"] = self.active_units
        return env

    def run(self, state: str = "check", check_mode: bool = False, path: str | None = None, **over) -> dict:
        args = self.args(state=state, **over)
        if check_mode:
            args["_ansible_check_mode"] = True
        args_file = self.root / "args.json"
        args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
        proc = subprocess.run([sys.executable, str(MODULE), str(args_file)], env=self.env(path),
                              capture_output=True, text=True, timeout=60, cwd=self.root)
        try:
            result = json.loads(proc.stdout)
        except ValueError:
            pytest.fail(f"the module printed no JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        assert proc.returncode == (1 if result.get("failed") else 0), proc.stderr
        return result

    def record_ok(self, **over) -> dict:
        result = self.run("record", **over)
        assert not result.get("failed"), result
        return result


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def test_record_then_check_unchanged_is_converged_and_secret_free(host):
    first = host.record_ok()
    assert first["changed"] is True
    assert first["recorded"] == {"globs": 2, "files": 2, "trees": 1, "tree_files": 2, "units": 0, "phases": 0}
    result = host.run("check")
    assert result["converged"] is True, result
    assert result["reasons"] == []
    assert result["changed"] is False
    again = host.record_ok()
    assert again["changed"] is False, again
    assert stat.S_IMODE(host.record.stat().st_mode) == 0o600
    assert stat.S_IMODE(host.key.stat().st_mode) == 0o600
    assert len(bytes.fromhex(host.key.read_text().strip())) == 32
    text = host.record.read_text()
    record = json.loads(text)
    assert record["version"] == 1
    assert sorted(record["files"]) == sorted(host.args()["files"])
    assert record["trees"] == {str(host.model): {"config.json": 22, "weights/model-00001.safetensors": 4096}}
    for f in (host.unit_file, host.env_file, host.model / "config.json"):
        assert hashlib.sha256(f.read_bytes()).hexdigest() not in text
    assert FINGERPRINT not in text
    assert hashlib.sha256(FINGERPRINT.encode()).hexdigest() not in text
    assert "sk-very-secret" not in text


def test_a_dropin_is_drift_on_every_check_and_named(host):
    """`absent` globs are looked at by every check, never recorded: a drop-in added after the record
    (or one the record was written beside) makes the host not converged, naming the file."""
    dropins = [str(host.units_dir / "sglang-*.service.d" / "*.conf")]
    host.record_ok(absent=dropins)
    assert host.run("check", absent=dropins)["converged"] is True
    override = host.units_dir / "sglang-main.service.d" / "override.conf"
    override.parent.mkdir()
    (override.parent / "README").write_text("not a drop-in\n")
    assert host.run("check", absent=dropins)["converged"] is True  # only *.conf counts
    override.write_text("[Service]\nUser=root\n")
    prefix = host.units_dir / "sglang-.service.d" / "10-all.conf"
    prefix.parent.mkdir()
    prefix.write_text("[Service]\nExecStartPre=+/bin/true\n")
    result = host.run("check", absent=dropins)
    assert result["converged"] is False
    assert result["reasons"] == [f"{prefix} exists and must not (it matches {dropins[0]})",
                                 f"{override} exists and must not (it matches {dropins[0]})"]
    assert str(override) in result["msg"]
    # Recorded with a drop-in there: the next check still names it.
    host.record_ok(absent=dropins)
    assert host.run("check", absent=dropins)["converged"] is False
    override.unlink()
    prefix.unlink()
    assert host.run("check", absent=dropins)["converged"] is True


def test_hand_edited_unit_file_is_named_as_changed(host):
    host.record_ok()
    host.unit_file.write_text("[Service]\nExecStart=/usr/bin/sglang --port 30001\n")
    result = host.run("check")
    assert result["converged"] is False
    assert result["reasons"] == [f"{host.unit_file} was changed since the last whole run"]


def test_deleted_tree_file_is_named_missing(host):
    host.record_ok()
    (host.model / "weights" / "model-00001.safetensors").unlink()
    result = host.run("check")
    assert result["converged"] is False
    assert result["reasons"] == [f"{host.model}/weights/model-00001.safetensors is missing"]


def test_tree_file_that_changed_size_is_named_with_both_sizes(host):
    host.record_ok()
    (host.model / "config.json").write_text("{}\n")
    result = host.run("check")
    assert result["reasons"] == [f"{host.model}/config.json changed size (22 -> 3 bytes)"]


def test_new_file_matching_a_glob_is_new_but_a_file_added_to_a_tree_is_fine(host):
    host.record_ok()
    (host.model / "tokenizer.json").write_text("{}\n")
    assert host.run("check")["converged"] is True
    new_unit = host.units_dir / "sglang@b.service"
    new_unit.write_text("[Service]\n")
    result = host.run("check")
    assert result["converged"] is False
    assert len(result["reasons"]) == 1
    assert result["reasons"][0].startswith(f"{new_unit} is new")


def test_other_fingerprint_is_a_release_change(host):
    host.record_ok()
    result = host.run("check", fingerprint="release-digest-0000000000000000")
    assert result["converged"] is False
    assert len(result["reasons"]) == 1
    assert result["reasons"][0].startswith("the desired release changed since the last whole run")


PHASES = {"rocm": "rocm-digest-1", "venv": "venv-digest-1", "models": "models-digest-1"}
OUTPUTS = {"venv": {"sglang_venv_target_path": "/opt/sglang/releases/abc"},
           "models": {"models_main_path": "/srv/models/seed-27b/1a2b"}}


def test_a_changed_release_keeps_the_phases_whose_digest_is_the_same(host):
    host.record_ok(phases=PHASES, outputs=OUTPUTS)
    record = json.loads(host.record.read_text())
    assert sorted(record["phases"]) == ["models", "rocm", "venv"]
    assert "rocm-digest-1" not in host.record.read_text()
    result = host.run("check", fingerprint="another-release",
                      phases={**PHASES, "models": "models-digest-2"})
    assert result["converged"] is False
    assert result["reasons"] == ["the desired release changed since the last whole run"]
    assert result["current_phases"] == ["rocm", "venv"]
    assert result["outputs"] == {"rocm": {}, "venv": OUTPUTS["venv"]}
    same = host.run("check", phases=PHASES)
    assert same["converged"] is True
    assert same["current_phases"] == ["models", "rocm", "venv"]


def test_drift_leaves_no_phase_current(host):
    host.record_ok(phases=PHASES, outputs=OUTPUTS)
    (host.model / "config.json").unlink()
    result = host.run("check", fingerprint="another-release", phases=PHASES)
    assert result["current_phases"] == []
    assert result["outputs"] == {}
    assert result["reasons"] == ["the desired release changed since the last whole run",
                                 f"{host.model}/config.json is missing"]


def test_a_record_without_phases_has_none_current(host):
    host.record_ok()
    result = host.run("check", fingerprint="another-release", phases=PHASES)
    assert result["current_phases"] == []
    assert result["reasons"] == ["the desired release changed since the last whole run"]


def test_outputs_of_a_phase_not_given_are_refused(host):
    result = host.run("record", phases={"rocm": "d"}, outputs={"venv": {}})
    assert result["failed"]
    assert "outputs names phase 'venv'" in result["msg"]


def test_no_record_is_not_converged(host):
    result = host.run("check")
    assert result["converged"] is False
    assert result["reasons"] == [
        f"no converged record at {host.record}: the host has not completed a whole run with this toolkit yet"
    ]


def test_corrupt_record_and_missing_key_are_reasons(host):
    host.record_ok()
    host.key.unlink()
    (reason,) = host.run("check")["reasons"]
    assert "key of the converged record" in reason
    assert "is missing" in reason
    host.record.write_text("{not json")
    (reason,) = host.run("check")["reasons"]
    assert reason.startswith(f"the converged record at {host.record} is corrupt")


def test_units_inactive_at_check_and_refused_at_record(host):
    host.active_units = "sglang@a.service router.service"
    units = ["sglang@a.service", "router.service"]
    assert host.record_ok(units=units)["recorded"]["units"] == 2
    assert host.run("check")["converged"] is True
    host.active_units = "sglang@a.service"
    result = host.run("check")
    assert result["converged"] is False
    assert result["reasons"] == ["router.service is not active (inactive)"]
    refused = host.run("record", units=units)
    assert refused["failed"] is True
    assert "router.service (inactive)" in refused["msg"]
    assert "sglang@a.service" not in refused["msg"]


@pytest.mark.skipif(any(os.path.exists(f"{d}/systemctl") for d in ("/sbin", "/usr/sbin", "/usr/local/sbin")),
                    reason="get_bin_path also searches the sbin directories, and this system has systemctl there")
def test_units_without_systemctl_are_not_active(host):
    host.active_units = "sglang@a.service"
    host.record_ok(units=["sglang@a.service"])
    result = host.run("check", path=str(host.root / "empty-bin"))
    assert result["reasons"] == ["sglang@a.service is not active (systemctl is missing on this host)"]


def test_record_in_check_mode_writes_nothing(host):
    result = host.run("record", check_mode=True)
    assert result["changed"] is True
    assert not host.state.exists()
    host.record_ok()
    before = (host.record.read_bytes(), host.key.read_bytes())
    host.unit_file.write_text("edited\n")
    result = host.run("record", check_mode=True)
    assert result["changed"] is True
    assert (host.record.read_bytes(), host.key.read_bytes()) == before
    assert host.run("check")["converged"] is False


def test_record_fails_on_a_missing_tree_and_a_dangling_symlink(host):
    missing = host.root / "models" / "gone"
    result = host.run("record", trees=[str(missing)])
    assert result["failed"] is True
    assert f"cannot record tree {missing}: it does not exist" in result["msg"]
    (host.model / "dangling").symlink_to(host.root / "nowhere")
    result = host.run("record")
    assert result["failed"] is True
    assert "dangling symlink" in result["msg"]
    assert not host.record.exists()


def test_through_ansible_adhoc(host, tmp_path):
    ansible = VENV_BIN / "ansible"
    env = host.env()
    env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LIBRARY=str(REPO / "library"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"), ANSIBLE_REMOTE_TMP=str(tmp_path / "ansible-remote"),
               ANSIBLE_NOCOLOR="1")
    results = []
    for state in ("record", "check"):
        args = json.dumps(host.args(state=state))
        proc = subprocess.run(
            [str(ansible if ansible.exists() else "ansible"), "localhost", "-c", "local", "-i", "localhost,",
             "-e", json.dumps({"ansible_python_interpreter": sys.executable}),
             "-o", "-m", "fleet_release_state", "-a", args],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # -o: one line per host, "localhost | CHANGED => {...}"
        line = next(line for line in proc.stdout.splitlines() if line.startswith("localhost | "))
        results.append(json.loads(line.split(" => ", 1)[1]))
    assert results[0]["changed"] is True
    assert results[1]["converged"] is True
    assert results[1]["reasons"] == []


def test_the_secrets_go_into_the_hmac_only(host):
    """Issue 24: the controller's fingerprint holds no key; the keys come as the no_log option
    `secrets` and are HMACed with it: another key is a release change, the same key converged, and
    neither the key nor a plain hash of it is in the record."""
    secrets = {"release": '{"secrets": {"sglang_service_api_key": "k-rot-A1"}}',
               "phases": {"models": '{"secrets": {"models_hf_token": "hf-A2"}}'}}
    host.record_ok(secrets=secrets, phases=PHASES, outputs=OUTPUTS)
    text = host.record.read_text()
    assert "k-rot-A1" not in text
    assert "hf-A2" not in text
    assert host.run("check", secrets=secrets, phases=PHASES)["converged"] is True
    rotated = {"release": secrets["release"].replace("A1", "B1"),
               "phases": {"models": secrets["phases"]["models"].replace("A2", "B2")}}
    result = host.run("check", secrets=rotated, phases=PHASES)
    assert result["converged"] is False
    assert result["reasons"] == ["the desired release changed since the last whole run"]
    assert result["current_phases"] == ["rocm", "venv"]
    assert "k-rot" not in json.dumps(result)
    # Without secrets the record is the fingerprint's alone, as before the option existed.
    assert host.run("check", phases=PHASES)["converged"] is False
