"""Api keys never on the command line: the sglang_service role's secrets file and config hash, the
simulator's --config (merged as SGLang 0.5.23 merges it), the unit's IP allow list.

- The plan renders the keys into <config_dir>/<name>.secrets.yaml (SGLang's --config YAML, root 0600);
  the unit loads it as the systemd credential secrets.yaml and passes --config %d/secrets.yaml, the
  env file and the argv hold no key; the config hash covers the file only through a
  salted digest, so no one can test a guessed key against a published hash.
- The simulator reads --config like SGLang (config first, then argv) and then requires the key.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from plugins import load

ROOT = Path(__file__).resolve().parents[2]
filters = load("roles/sglang_service/filter_plugins/sglang_service.py", "sglang_service_filters_secrets")
KEY, ADMIN, OTHER = "k-fleet-Z81q", "k-admin-Q7w2", "k-own-M3x9"

# The plan with its env and secrets contents, written out for the assertions.
PLAYBOOK = json.dumps([{
    "hosts": "localhost", "connection": "local", "gather_facts": False,
    "tasks": [
        {"ansible.builtin.include_role": {"name": "sglang_service", "tasks_from": "plan.yml"}},
        {"ansible.builtin.copy": {
            "content": "{{ {'plan': _sglang_service_plan, 'env': _sglang_service_env_contents,"
                       " 'secrets': _sglang_service_secret_contents} | to_json }}",
            "dest": "{{ out }}/plan.json", "mode": "0600"}},
    ],
}])


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> Path:
    """The host's state directory (its .secrets-salt), one per test module: the renders compared with
    each other share it, and two pytest runs at once (two checkouts) never share it."""
    return tmp_path_factory.mktemp("state")


def render(tmp: Path, salt: str, state: Path, **extra) -> dict:
    """The plan of three instances (fleet key, own key + admin key, no key) with a given host salt."""
    state.mkdir(parents=True, exist_ok=True)
    (state / ".secrets-salt").write_text(salt + "\n")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "render.yml").write_text(PLAYBOOK)
    variables = {
        "out": str(tmp),
        "ansible_python_interpreter": sys.executable,
        "sglang_service_state_dir": str(state),
        "sglang_service_draft_model_path": "/srv/models/draft",
        "sglang_service_api_key": KEY,
        "sglang_service_instances": [
            {"name": "main", "port": 30004},
            {"name": "own", "port": 30005, "api_key": OTHER, "admin_api_key": ADMIN},
            {"name": "open", "port": 30006, "api_key": ""},
        ],
        **extra,
    }
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_FACT_CACHING="memory", ANSIBLE_NOCOLOR="1")
    run = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(tmp / "render.yml"),
         "-e", json.dumps(variables)],
        env=env, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    for secret in (KEY, ADMIN, OTHER):
        assert secret not in run.stdout + run.stderr  # no_log where the keys pass
    return json.loads((tmp / "plan.json").read_text())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, state) -> dict:
    return render(tmp_path_factory.mktemp("secrets"), "salt-one", state)


def by_name(rendered: dict) -> dict:
    return {entry["name"]: entry for entry in rendered["plan"]}


def test_keys_only_in_the_secrets_file(rendered):
    plan = by_name(rendered)
    assert json.loads(rendered["secrets"]["main"]) == {"api-key": KEY}
    assert json.loads(rendered["secrets"]["own"]) == {"api-key": OTHER, "admin-api-key": ADMIN}
    assert rendered["secrets"]["open"] == ""
    for name, entry in plan.items():
        for secret in (KEY, ADMIN, OTHER):
            assert secret not in entry["unit_content"]
            assert secret not in rendered["env"][name]
            assert secret not in json.dumps(entry["launch_argv"] + entry["check_argv"])
        assert "--api-key" not in entry["unit_content"]
    # SGLang reads its own copy in the unit's credentials directory, never the root-only file.
    assert plan["main"]["launch_argv"][-2:] == ["--config", "/run/credentials/sglang-main.service/secrets.yaml"]
    assert "    --config %d/secrets.yaml\n" in plan["main"]["unit_content"]
    exec_lines = plan["main"]["unit_content"].split("\nExecStart=", 1)[1].split("\n")
    exec_start = [exec_lines[0], *itertools.takewhile(lambda line: line.startswith("    "), exec_lines[1:])]
    assert exec_start[-1] == "    --config %d/secrets.yaml"
    assert not [line for line in exec_start if "/etc/sglang" in line]
    assert "\nLoadCredential=secrets.yaml:/etc/sglang/main.secrets.yaml\n" in plan["main"]["unit_content"]
    assert "\nLoadCredential=secrets.yaml:/etc/sglang/own.secrets.yaml\n" in plan["own"]["unit_content"]
    assert "LoadCredential" not in plan["open"]["unit_content"]
    # SGLang's parser on the host reads the staged copy (root runs it), by path.
    assert plan["main"]["check_argv"][-2:] == ["--config", "/run/sglang-service-staging/main/secrets.yaml"]
    assert plan["own"]["admin_api_key_set"] is True
    assert plan["open"]["secrets_set"] is False
    # Where stage looks for drop-ins it refuses (its own and the prefix sglang-.service.d, /etc and /run).
    assert plan["main"]["dropin_dirs"] == [
        "/etc/systemd/system/sglang-main.service.d", "/etc/systemd/system/sglang-.service.d",
        "/run/systemd/system/sglang-main.service.d", "/run/systemd/system/sglang-.service.d"]
    assert "--config" not in plan["open"]["launch_argv"]


def test_the_config_hash_is_no_plain_hash_of_the_key_file_and_follows_the_key(rendered, state, tmp_path):
    plan = by_name(rendered)
    for name in ("main", "own"):
        plain = hashlib.sha256(rendered["secrets"][name].encode()).hexdigest()
        unsalted = hashlib.sha256((plan[name]["unit_content"] + rendered["env"][name]
                                   + rendered["secrets"][name]).encode()).hexdigest()
        assert plan[name]["config_hash"] not in (plain, unsalted)
    # Same salt, same config: same hash (idempotent); another salt: another hash for keyed
    # instances only; another key: another release.
    again = by_name(render(tmp_path / "a", "salt-one", state))
    other_salt = by_name(render(tmp_path / "b", "salt-two", state))
    rotated = by_name(render(tmp_path / "c", "salt-one", state, sglang_service_api_key="k-rotated"))
    assert again["main"]["config_hash"] == plan["main"]["config_hash"]
    assert other_salt["main"]["config_hash"] != plan["main"]["config_hash"]
    assert other_salt["open"]["config_hash"] == plan["open"]["config_hash"]
    assert rotated["main"]["config_hash"] != plan["main"]["config_hash"]
    assert rotated["own"]["config_hash"] == plan["own"]["config_hash"]


def test_the_keyed_unit_passes_systemd_analyze_verify(rendered, tmp_path):
    """LoadCredential= and %d in ExecStart are accepted by this systemd (252 on the test hosts)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit = by_name(rendered)["own"]["unit_content"]
    # verify checks that ExecStart's binary exists: this python in its place, every argument kept.
    head, rest = unit.split("ExecStart=", 1)
    rest = f"{sys.executable} -c pass" + rest[rest.index(" -m "):]
    path = tmp_path / "sglang-own.service"
    path.write_text(head + "ExecStart=" + rest, encoding="utf-8")
    run = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60, check=False)
    ours = [line for line in run.stderr.splitlines() if "sglang-own.service" in line]
    assert run.returncode == 0, run.stderr
    assert ours == [], run.stderr
    assert "--config %d/secrets.yaml" in path.read_text()


@pytest.mark.parametrize(
    ("bind", "router", "extra", "expected"),
    [
        ("127.0.0.1", "", [], ["localhost"]),
        ("10.0.0.5", "http://10.0.1.9:30000", [], ["localhost", "10.0.0.0/24", "10.0.1.9"]),
        ("10.0.0.5", "http://router.example:30000", ["10.9.0.0/16"], ["localhost", "10.0.0.0/24", "10.9.0.0/16"]),
        ("fd00::5", "http://[fd00::1]:30000", [], ["localhost", "fd00::/64", "fd00::1"]),
        ("0.0.0.0", "", [], []),  # noqa: S104 (a bind address under test)
        ("0.0.0.0", "", ["10.0.0.0/8"], ["localhost", "10.0.0.0/8"]),  # noqa: S104
    ],
)
def test_ip_allow(bind, router, extra, expected):
    assert filters.ip_allow(bind, router, extra, 24) == expected


def test_redact_admin_keys_and_the_config_file_form():
    text = 'x --admin-api-key a1 admin_api_key=\'a2\' "api-key": "a3", api-key: a4'
    assert filters.redact(text, []) == (
        'x --admin-api-key <redacted> admin_api_key=\'<redacted>\' "api-key": "<redacted>", api-key: <redacted>')


# --- the simulator's --config ----------------------------------------------------------------------
sys.path.insert(0, str(ROOT / "sim"))
from sglang_sim import args as sim_args  # noqa: E402


def test_sim_merges_config_like_sglang(tmp_path):
    config = tmp_path / "keys.yaml"
    config.write_text(json.dumps({"api-key": KEY, "enable-cache-report": True, "enable-metrics": False}))
    argv = ["--model-path", "/m", "--config", str(config), "--port", "31000"]
    merged = sim_args.merge_config(argv, sim_args.table()["flags"])
    assert merged == ["--api-key", KEY, "--enable-cache-report", "--model-path", "/m", "--port", "31000"]
    parsed = sim_args.parse_argv(argv)
    assert parsed.values["api_key"] == KEY
    # The command line wins over the file, as in SGLang (config first, then argv).
    assert sim_args.parse_argv([*argv, "--api-key", "cli"]).values["api_key"] == "cli"


@pytest.mark.parametrize(
    ("name", "content", "error"),
    [
        ("keys.json", "{}", "Config file must be YAML format"),
        ("missing.yaml", None, "Config file not found"),
        ("list.yaml", "[1, 2]", "Config file must contain a dictionary at root level"),
    ],
)
def test_sim_config_errors(tmp_path, name, content, error):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(sim_args.UsageError, match=error):
        sim_args.merge_config(["--config", str(path)], {})
    with pytest.raises(sim_args.UsageError, match="Only one allowed"):
        sim_args.merge_config(["--config", "a.yaml", "--config", "b.yaml"], {})


def _status(port: int, path: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers),
                                    timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, OSError):
        return -1  # not listening yet


def test_the_simulator_requires_the_key_from_its_config_file(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "sim"))
    from procs import stop_by_pid
    from sglang_sim.fixture_model import write_model_dir
    from simharness import SMALL_ENV, start_sim

    model = write_model_dir(tmp_path / "model")
    config = tmp_path / "secrets.yaml"
    config.write_text(json.dumps({"api-key": KEY}) + "\n")
    sim = start_sim(tmp_path, model, ["--tp-size", "2", "--config", str(config)], SMALL_ENV, wait=False)
    try:
        import time

        deadline = time.monotonic() + 30
        while _status(sim.port, "/health", None) != 200:
            assert sim.proc.poll() is None, sim.log()
            assert time.monotonic() < deadline, sim.log()
            time.sleep(0.1)
        assert KEY not in " ".join(sim.proc.args)  # only the path on the command line
        assert _status(sim.port, "/get_model_info", None) == 401
        assert _status(sim.port, "/get_model_info", "wrong") == 401
        assert _status(sim.port, "/get_model_info", KEY) == 200
        assert _status(sim.port, "/health", None) == 200  # as SGLang: health needs no key
    finally:
        stop_by_pid(sim.proc)
