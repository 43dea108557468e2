"""The temporary unit of a HiCache sizing candidate (module_utils/sglang_sizing_unit.py and
library/sglang_sizing_unit.py), on release directories built from the sglang_service role's real plan:
- the candidate's ExecStart is the release's argv with the overrides, quoted and laid out as the role's
  template does (no overrides: the release's ExecStart line for line), the --config tail and
  LoadCredential kept; Restart=no, RuntimeMaxSec, Conflicts= and OnFailure= the real unit; every other
  line the release's;
- a release whose unit and argv.json disagree, a missing file, a bad flag are refused, nothing written;
- through Ansible: check mode writes nothing, a second run changes nothing, daemon-reload only on change;
- the written unit passes systemd-analyze verify.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ansible.module_utils
import pytest
from sizing_releases import FILTERS, make_release

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))

from ansible.module_utils import sglang_sizing_unit as sizing  # noqa: E402

ADDED = ("Description=", "Conflicts=", "OnFailure=", "Restart=", "RuntimeMaxSec=")


def _params(release: Path, unit_dir: Path, **extra) -> dict:
    return {"release_dir": str(release), "unit": "sglang-main.service", "unit_dir": str(unit_dir),
            "runtime_max_sec": 900, "args": {}, **extra}


def _exec_block(text: str) -> list[str]:
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    end = start
    while lines[end].endswith("\\"):
        end += 1
    return lines[start:end + 1]


def _rest(text: str) -> list[str]:
    """The unit's lines outside ExecStart, the directives the candidate replaces, comments and [Install]."""
    block = set(_exec_block(text))
    body = text.split("\n[Install]")[0].split("\n")
    return [line for line in body if line not in block and not line.startswith(ADDED) and not line.startswith("#")]


@pytest.fixture
def unit_dir(tmp_path) -> Path:
    path = tmp_path / "run-systemd"
    path.mkdir()
    return path


def test_without_overrides_the_exec_start_is_the_release_s_and_the_rest_identical(plan, tmp_path, unit_dir):
    release = make_release(plan, "main", tmp_path / "releases" / "abc")
    result = sizing.ensure(_params(release, unit_dir), check_mode=False)
    written = (unit_dir / "sglang-main-sizing.service").read_text()
    real = plan["main"]["unit_content"]
    assert result["changed"]
    assert result["reload"]
    assert result["path"] == str(unit_dir / "sglang-main-sizing.service")
    assert _exec_block(written) == _exec_block(real)
    assert _rest(written) == _rest(real)
    for line in ("User=sglang", "LimitMEMLOCK=infinity", "EnvironmentFile=/etc/sglang/main.env",
                 "LoadCredential=secrets.yaml:/etc/sglang/main.secrets.yaml", "ProtectSystem=strict"):
        assert line in written.split("\n"), line
    assert (unit_dir / "sglang-main-sizing.service").stat().st_mode & 0o7777 == 0o644


def test_overrides_in_place_new_flags_before_the_config_tail_null_drops(plan, tmp_path, unit_dir):
    release = make_release(plan, "main", tmp_path / "rel")
    args = {"--hicache-size": 16, "--mem-fraction-static": "0.85", "--hicache-ratio": None,
            "--cuda-graph-bs-decode": [1, 2], "--disable-radix-cache": True, "--log-level": "info 50% $HOME"}
    result = sizing.ensure(_params(release, unit_dir, args=args), check_mode=False)
    text = (unit_dir / "sglang-main-sizing.service").read_text()
    block = _exec_block(text)
    argv = json.loads((release / "argv.json").read_text())
    expected = list(argv[:-2])
    expected[expected.index("--hicache-size") + 1] = "16"
    expected[expected.index("--mem-fraction-static") + 1] = "0.85"
    ratio = expected.index("--hicache-ratio")
    del expected[ratio:ratio + 2]
    bs = expected.index("--cuda-graph-bs-decode")
    expected[bs:bs + 4] = ["--cuda-graph-bs-decode", "1", "2"]
    expected += ["--disable-radix-cache", "--log-level", "info 50% $HOME"]
    assert result["argv"] == [*expected, "--config", "/run/credentials/sglang-main-sizing.service/secrets.yaml"]
    assert "    --hicache-size 16 \\" in block
    assert "    --mem-fraction-static 0.85 \\" in block
    assert not [line for line in block if "--hicache-ratio" in line]
    # New flags appended after the release's flags, quoted as the role quotes, before the --config tail.
    assert block[-3:] == ["    --disable-radix-cache \\",
                          "    --log-level " + FILTERS.systemd_quote("info 50% $HOME") + " \\",
                          "    --config %d/secrets.yaml"]
    assert '"info 50%% $$HOME"' in block[-2]
    lines = text.split("\n")
    for line in ("Restart=no", "RuntimeMaxSec=900", "Conflicts=sglang-main.service", "OnFailure=sglang-main.service",
                 "LoadCredential=secrets.yaml:/etc/sglang/main.secrets.yaml"):
        assert line in lines, line
    assert "Restart=on-failure" not in lines
    assert "[Install]" not in lines
    assert "WantedBy=multi-user.target" not in lines
    descriptions = [line for line in lines if line.startswith("Description=")]
    assert descriptions == ["Description=HiCache sizing candidate of sglang-main.service (temporary): "
                            "SGLang server main on 127.0.0.1:30004 (seed-validated)"]
    # The ExecStart of the candidate runs what `argv` says (read back with the module's own parser).
    _, _, python, module, tail = sizing.parse_exec(text, result["argv"], "sglang-main-sizing.service", "x")
    assert (python, module, tail) == ("/opt/sglang/current/bin/python", "sglang.launch_server", True)


def test_an_instance_without_keys_has_no_config_tail(plan, tmp_path, unit_dir):
    release = make_release(plan, "open", tmp_path / "rel")
    result = sizing.ensure(_params(release, unit_dir, unit="sglang-open.service", args={"--hicache-size": 8}),
                           check_mode=False)
    text = (unit_dir / "sglang-open-sizing.service").read_text()
    assert "--config" not in result["argv"]
    assert "--config" not in text
    assert "LoadCredential=" not in text
    assert _exec_block(text)[-1] == "    --hicache-write-policy write_through"  # the last line ends the command


@pytest.mark.parametrize("word", ["plain", "", ";", "a b", 'q"uote', "back\\slash", "50%", "$HOME", "${X}", "%d",
                                  "'single'", "tab\there", "ü", "--flag=x"])
def test_quoting_is_the_role_s_and_reads_back(word):
    quoted = sizing.systemd_quote(word)
    assert quoted == FILTERS.systemd_quote(word)
    (raw, value), = sizing.split_exec(quoted)
    assert raw == quoted
    assert sizing.resolve(value, "/run/credentials/u") == word


def _refused(params: dict, unit_dir: Path, *needles: str) -> None:
    with pytest.raises(sizing.SizingUnitError) as err:
        sizing.ensure(params, check_mode=False)
    for needle in needles:
        assert needle in str(err.value), str(err.value)
    assert list(unit_dir.iterdir()) == []


def test_refusals_name_the_option_and_write_nothing(plan, tmp_path, unit_dir):
    release = make_release(plan, "main", tmp_path / "rel")
    _refused(_params(release, unit_dir, args={"hicache-size": 16}), unit_dir, "args", "'hicache-size'", "'--'")
    _refused(_params(release, unit_dir, args={16: 16}), unit_dir, "args", "starting with '--'")
    _refused(_params(release, unit_dir, args={"--api-key": "x"}), unit_dir, "--api-key", "secrets file")
    _refused(_params(release, unit_dir, args={"--hicache-size": {"a": 1}}), unit_dir, "--hicache-size", "scalar")
    _refused(_params(release, unit_dir, name="sglang-main.service"), unit_dir, "name", "real unit")
    _refused(_params(release, unit_dir, runtime_max_sec=0), unit_dir, "runtime_max_sec")
    _refused(_params(release, unit_dir, unit="sglang-open.service"), unit_dir, "release of sglang-main.service",
             "unit sglang-open.service")
    _refused(_params(tmp_path / "nothing", unit_dir), unit_dir, "release_dir", "no unit")
    (release / "argv.json").rename(tmp_path / "argv.json")
    _refused(_params(release, unit_dir), unit_dir, "release_dir", "no argv.json")
    (tmp_path / "argv.json").rename(release / "argv.json")


@pytest.mark.parametrize(("edit", "file"), [
    (("--port 30004", "--port 30005"), "unit"),                            # the unit edited by hand
    (("--mem-fraction-static 0.80", "--mem-fraction-static 0.80 --foo"), "unit"),
    (("%d/secrets.yaml", "/etc/sglang/main.secrets.yaml"), "unit"),        # the tail no longer the credential
    (('"30004"', '"30005"'), "argv.json"),                                  # argv.json edited
    (("-m sglang.launch_server", "sglang.launch_server"), "unit"),
])
def test_a_release_whose_exec_start_and_argv_disagree_is_refused(plan, tmp_path, unit_dir, edit, file):
    release = make_release(plan, "main", tmp_path / "rel")
    path = release / file
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1], 1))
    _refused(_params(release, unit_dir), unit_dir, "release_dir", "does not run what argv.json says", "Restage")


def test_check_mode_writes_nothing_and_absent_removes(plan, tmp_path, unit_dir):
    release = make_release(plan, "main", tmp_path / "rel")
    checked = sizing.ensure(_params(release, unit_dir), check_mode=True)
    assert checked["changed"]
    assert checked["diff"]["before"] == ""
    assert "RuntimeMaxSec=900" in checked["diff"]["after"]
    assert list(unit_dir.iterdir()) == []
    first = sizing.ensure(_params(release, unit_dir), check_mode=False)
    again = sizing.ensure(_params(release, unit_dir), check_mode=False)
    assert not again["changed"]
    assert not again["reload"]
    assert again["unit_sha1"] == first["unit_sha1"]
    path = unit_dir / "sglang-main-sizing.service"
    path.chmod(0o600)
    fixed = sizing.ensure(_params(release, unit_dir), check_mode=False)
    assert fixed["changed"]
    assert not fixed["reload"]
    assert path.stat().st_mode & 0o777 == 0o644
    other = sizing.ensure(_params(release, unit_dir, runtime_max_sec=60), check_mode=False)
    assert other["changed"]
    assert other["reload"]
    assert "RuntimeMaxSec=60" in path.read_text()
    gone_check = sizing.ensure({"unit": "sglang-main.service", "unit_dir": str(unit_dir), "state": "absent"}, True)
    assert gone_check["changed"]
    assert path.exists()
    gone = sizing.ensure({"unit": "sglang-main.service", "unit_dir": str(unit_dir), "state": "absent"}, False)
    assert gone["changed"]
    assert gone["reload"]
    assert not path.exists()
    assert not sizing.ensure({"unit": "sglang-main.service", "unit_dir": str(unit_dir), "state": "absent"},
                             False)["changed"]


def test_the_written_unit_passes_systemd_analyze_verify(plan, tmp_path, unit_dir):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    release = make_release(plan, "main", tmp_path / "rel")
    # verify checks that ExecStart's binary exists: this python in the venv's place, every argument kept.
    unit = release / "unit"
    unit.write_text(unit.read_text().replace("/opt/sglang/current/bin/python", sys.executable))
    shutil.copy(unit, unit_dir / "sglang-main.service")  # the real unit Conflicts=/OnFailure= name
    sizing.ensure(_params(release, unit_dir, args={"--hicache-size": 16}), check_mode=False)
    path = unit_dir / "sglang-main-sizing.service"
    run = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60, check=False)
    ours = [line for line in run.stderr.splitlines() if "sizing" in line]
    assert run.returncode == 0, run.stderr
    assert ours == [], run.stderr


# --- the module through Ansible (AnsiballZ, local connection) ---------------------------------------
def _ansible(args: dict, fakebin: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    argv = [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-m", "sglang_sizing_unit",
            "-a", json.dumps(args), "-e", f"ansible_python_interpreter={sys.executable}", *extra]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{fakebin}:{os.environ['PATH']}", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    run = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False)
    # The ad-hoc output: the diff (with --diff), then `localhost | CHANGED => {the result as JSON}`.
    payload = run.stdout.rsplit("localhost | ", 1)[-1].split(" => ", 1)[-1]
    return run, json.loads(payload) if payload.startswith("{") else {}


@pytest.fixture
def fakebin(tmp_path) -> Path:
    """A systemctl that records its arguments (the module must reload only on change)."""
    path = tmp_path / "bin"
    path.mkdir()
    (path / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/systemctl.log\n')
    (path / "systemctl").chmod(0o755)
    return path


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "systemctl.log"
    return log.read_text().splitlines() if log.exists() else []


def test_the_module_check_mode_then_real_then_unchanged_then_absent(plan, tmp_path, unit_dir, fakebin):
    release = make_release(plan, "main", tmp_path / "rel")
    args = _params(release, unit_dir, args={"--hicache-size": 16, "--mem-fraction-static": "0.85"})
    path = unit_dir / "sglang-main-sizing.service"
    checked, result = _ansible(args, fakebin, "--check", "--diff")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "CHANGED" in checked.stdout
    assert "+RuntimeMaxSec=900" in checked.stdout
    assert not path.exists()
    assert _calls(tmp_path) == []
    done, result = _ansible(args, fakebin)
    assert done.returncode == 0, done.stdout + done.stderr
    assert result["changed"]
    assert result["reloaded"]
    assert "--hicache-size" in result["argv"]
    assert path.exists()
    assert _calls(tmp_path) == ["daemon-reload"]
    again, result = _ansible(args, fakebin)
    assert again.returncode == 0
    assert not result["changed"]
    assert not result["reloaded"]
    assert _calls(tmp_path) == ["daemon-reload"]
    removed, result = _ansible({"unit": "sglang-main.service", "unit_dir": str(unit_dir), "state": "absent"}, fakebin)
    assert removed.returncode == 0
    assert result["changed"]
    assert not path.exists()
    assert _calls(tmp_path) == ["daemon-reload", "daemon-reload"]


def test_the_module_refuses_a_bad_flag_naming_it(plan, tmp_path, unit_dir, fakebin):
    release = make_release(plan, "main", tmp_path / "rel")
    failed, _ = _ansible(_params(release, unit_dir, args={"hicache-size": 16}), fakebin)
    assert failed.returncode != 0
    assert "'hicache-size' is not a long SGLang flag" in failed.stdout
    assert "Nothing was written" in failed.stdout
    assert list(unit_dir.iterdir()) == []
    assert _calls(tmp_path) == []
