"""Verify sglang_service on a real systemd test host, running the simulator in SGLang's place.

The running state (active units, sockets on the host's own address, the service user, the unit's
hardening as systemd reports it), then behaviour on change: --check --diff shows a pending change
and restarts nothing; each bad profile fails before any restart with its message while the old
service keeps serving; a real change restarts and the rollback restores the previous release.
side_effect.yml's record: five config changes in a row all restart main (the start limit never
refuses a deliberate restart); a server that exits at start fails the health wait early with the
unit's state and journal in the message and no api key anywhere in the output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest
import testinfra.utils.ansible_runner

# The secrets search, shared by the scenarios' verify files.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "resources"))
import secret_search

inventory = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(inventory).get_hosts("all")

SCENARIO = Path(__file__).resolve().parent.parent
PROJECT = SCENARIO.parent.parent
ADDRESS = "127.0.16.1"
INSTANCES = {"main": 30004, "baseline": 30010}
MODEL = "/srv/models/fixture main"
HICACHE = {
    "--enable-hierarchical-cache": True,
    "--hicache-size": 2,
    "--hicache-ratio": "2.0",
    "--hicache-io-backend": "kernel",
    "--hicache-host-memory-mode": "cache",
    "--hicache-write-policy": "write_through",
}


def instances(main_args: dict | None = None) -> list[dict]:
    """The scenario's instances (vars/main.yml, baseline's own api key too), with overrides for `main`."""
    return [
        {"name": "main", "port": 30004, "environment": {"HIP_VISIBLE_DEVICES": "0,1"}, "args": main_args or {}},
        {
            "name": "baseline",
            "port": 30010,
            "profile": "seed-baseline",
            "hicache_enabled": False,
            "api_key": KEYS["baseline"],
            "environment": {"HIP_VISIBLE_DEVICES": "2,3"},
        },
    ]


def playbook(name: str, extra: dict | None = None, *options: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(PROJECT / "roles"),
        ANSIBLE_FACT_CACHING="memory",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        MOLECULE_PROJECT_DIRECTORY=str(PROJECT),
    )
    argv = [str(Path(os.sys.executable).parent / "ansible-playbook"), "-i", inventory, str(SCENARIO / name), *options]
    if extra:
        argv += ["-e", json.dumps(extra)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)


# The scenario's api keys (vars/main.yml): the fleet's for main, baseline's own.
KEYS = {"main": "svc-fleet-key-Vq93mZt0", "baseline": "svc-baseline-key-P7r2Lw"}
PORT_KEYS = {INSTANCES[name]: key for name, key in KEYS.items()}


def http(port: int, path: str, key: str | None = "") -> tuple[int, str]:
    """GET with the instance's api key (key=None: without one)."""
    key = PORT_KEYS.get(port) if key == "" else key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        request = urllib.request.Request(f"http://{ADDRESS}:{port}{path}", headers=headers)
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def main_pid(host, name: str) -> int:
    return int(host.check_output(f"systemctl show -p MainPID --value sglang-{name}.service"))


def unit_properties(host, name: str, properties: str) -> dict[str, str]:
    """`systemctl show -p …` of an instance's unit as a dict (properties: space-separated names)."""
    listed = " ".join(f"-p {prop}" for prop in properties.split())
    output = host.check_output(f"systemctl show sglang-{name}.service {listed}")
    return dict(line.split("=", 1) for line in output.splitlines())


def journal(host, name: str) -> str:
    return host.run(f"journalctl -u sglang-{name}.service -n 30 --no-pager").stdout


@pytest.mark.parametrize("name", INSTANCES)
def test_unit_active_and_enabled(host, name):
    service = host.service(f"sglang-{name}.service")
    assert service.is_running, journal(host, name)
    assert service.is_enabled


@pytest.mark.parametrize(("name", "port"), INSTANCES.items())
def test_listens_on_the_hosts_own_address(host, name, port):
    assert host.socket(f"tcp://{ADDRESS}:{port}").is_listening, journal(host, name)
    assert not host.socket(f"tcp://127.0.0.1:{port}").is_listening
    assert http(port, "/health_generate")[0] == 200, journal(host, name)


@pytest.mark.parametrize("name", INSTANCES)
def test_process_runs_as_the_service_user(host, name):
    pid = main_pid(host, name)
    assert pid > 0
    assert host.check_output(f"ps -o user= -p {pid}").strip() == "sglang"
    groups = host.user("sglang").groups
    assert "render" in groups
    assert "video" in groups


@pytest.mark.parametrize("name", INSTANCES)
def test_limits_and_hardening_in_effect(host, name):
    props = unit_properties(
        host, name, "LimitMEMLOCK LimitNOFILE ProtectSystem NoNewPrivileges PrivateTmp ProtectHome DevicePolicy "
        "DeviceAllow Restart StartLimitBurst User ReadWritePaths EnvironmentFiles MemoryMax TasksMax"
    )
    assert props["LimitMEMLOCK"] == "infinity"
    # The unit confines its own damage (sglang_service_memory_max 90 % of RAM, sglang_service_tasks_max).
    assert props["MemoryMax"] not in ("", "infinity"), props
    assert props["TasksMax"] == "8192"
    assert props["LimitNOFILE"] == "65536"
    assert props["ProtectSystem"] == "strict"
    assert props["NoNewPrivileges"] == "yes"
    assert props["PrivateTmp"] == "yes"
    assert props["ProtectHome"] == "yes"
    assert props["DevicePolicy"] == "closed"
    device_allow = host.check_output(f"systemctl show sglang-{name}.service -p DeviceAllow")
    assert "DeviceAllow=/dev/kfd rw" in device_allow
    # Render nodes only (the test host has no /dev/dri: none), no KMS card nodes (char-drm) by default.
    assert "char-drm" not in device_allow
    assert props["Restart"] == "on-failure"
    assert props["StartLimitBurst"] == "3"
    assert props["User"] == "sglang"
    # The home, and the JIT caches of the release it runs (<state>/<name>/cache/<release id>).
    release_id = host.file(f"/var/lib/sglang/{name}/current").linked_to.rstrip("/").rsplit("/", 1)[-1]
    assert props["ReadWritePaths"].split() == [f"/var/lib/sglang/{name}/home",
                                              f"/var/lib/sglang/{name}/cache/{release_id}"]
    cache = host.file(f"/var/lib/sglang/{name}/cache/{release_id}/triton")
    assert cache.is_directory
    assert cache.user == "sglang"
    assert cache.mode == 0o750
    assert host.file(f"/var/lib/sglang/{name}/cache").user == "root"
    assert f"/etc/sglang/{name}.env" in props["EnvironmentFiles"]


def _hard_memlock(host, pid: int) -> str:
    for line in host.check_output(f"cat /proc/{pid}/limits").splitlines():
        if line.startswith("Max locked memory"):
            return line.split()[4]
    raise AssertionError(f"no memlock line in /proc/{pid}/limits")


@pytest.mark.parametrize("name", INSTANCES)
def test_process_may_pin_unlimited_memory(host, name):
    """The running process has the unlimited memlock limit the pinned HiCache pool needs."""
    ceiling = _hard_memlock(host, 1)
    if ceiling != "unlimited":
        # systemd cannot raise a limit above its own hard limit; an nspawn guest inherits it.
        pytest.skip(f"this test host's PID 1 has a hard memlock limit of {ceiling} bytes")
    assert _hard_memlock(host, main_pid(host, name)) == "unlimited"


def test_the_service_sees_a_read_only_system_and_a_writable_home(host):
    pid = main_pid(host, "main")
    mounts = {
        fields[4]: fields[5]
        for fields in (line.split() for line in host.check_output(f"cat /proc/{pid}/mountinfo").splitlines())
    }
    assert mounts["/"].startswith("ro,"), mounts  # ProtectSystem=strict
    assert mounts["/var/lib/sglang/main/home"].startswith("rw,"), mounts


@pytest.mark.parametrize("name", INSTANCES)
def test_env_file_is_root_only(host, name):
    env = host.file(f"/etc/sglang/{name}.env")
    assert env.user == "root"
    assert env.mode == 0o600
    assert KEYS[name] not in env.content_string


# --- secrets: as a local user without privileges, with api keys configured -----------------------
OUTSIDER = "nobody"


def as_outsider(host, command: str) -> str:
    """What an unprivileged local user sees (stdout and stderr) running `command`."""
    result = host.run("runuser -u %s -- sh -c %s", OUTSIDER, command)
    return result.stdout + result.stderr


@pytest.mark.parametrize("name", INSTANCES)
def test_secrets_file_is_root_only_and_reaches_its_instance_alone(host, name):
    secrets = host.file(f"/etc/sglang/{name}.secrets.yaml")
    assert secrets.user == "root"
    assert secrets.group == "root"
    assert secrets.mode == 0o600
    assert json.loads(secrets.content_string) == {"api-key": KEYS[name]}
    assert "Permission denied" in as_outsider(host, f"cat /etc/sglang/{name}.secrets.yaml")
    # Not even the service user (every instance runs as it) reads the file: each unit gets its own
    # copy as a systemd credential, in a directory only its mount namespace shows.
    as_service = host.run("runuser -u sglang -- cat /etc/sglang/%s.secrets.yaml", name)
    assert as_service.rc != 0
    assert "Permission denied" in as_service.stderr
    other = "baseline" if name == "main" else "main"
    pid = main_pid(host, name)
    seen = host.run("nsenter -t %s -m -S $(id -u sglang) -G $(id -g sglang) cat /run/credentials/sglang-%s.service/"
                    "secrets.yaml", str(pid), other)
    assert seen.rc != 0, f"{name}'s process reads {other}'s credential"
    assert KEYS[other] not in seen.stdout
    own = host.run("nsenter -t %s -m -S $(id -u sglang) -G $(id -g sglang) cat /run/credentials/sglang-%s.service/"
                   "secrets.yaml", str(pid), name)
    assert own.rc == 0, own.stderr
    assert KEYS[name] in own.stdout


@pytest.mark.parametrize("name", INSTANCES)
def test_no_other_user_reads_the_key(host, name):
    key = KEYS[name]
    unit = f"sglang-{name}.service"
    pid = main_pid(host, name)
    seen = {
        "ps": as_outsider(host, "ps axww -o pid,args"),
        "/proc/*/cmdline": as_outsider(host, "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"),
        "/proc/<MainPID>/cmdline": as_outsider(host, f"tr '\\0' ' ' < /proc/{pid}/cmdline"),
        "/proc/<MainPID>/environ": as_outsider(host, f"cat /proc/{pid}/environ"),
        "systemctl show": as_outsider(host, f"systemctl show {unit}"),
        "systemctl cat": as_outsider(host, f"systemctl cat {unit}"),
        "the unit file": as_outsider(host, f"cat /etc/systemd/system/{unit}"),
        "journalctl": as_outsider(host, f"journalctl -u {unit} --no-pager -n 200"),
        "/etc/sglang": as_outsider(host, "cat /etc/sglang/*"),
    }
    for where, text in seen.items():
        assert key not in text, f"{name}'s api key readable by {OUTSIDER} in {where}"
    # The unit loads the file as a credential and hands SGLang its copy's path only; root sees the key
    # nowhere on the command line either.
    unit_text = host.file(f"/etc/systemd/system/{unit}").content_string
    assert f"\nLoadCredential=secrets.yaml:/etc/sglang/{name}.secrets.yaml\n" in unit_text
    assert "    --config %d/secrets.yaml\n" in unit_text
    assert f"--config /run/credentials/{unit}/secrets.yaml" in host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    assert key not in host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    assert key not in host.check_output(f"systemctl show {unit}")
    assert "--api-key" not in host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")


@pytest.mark.parametrize("name", INSTANCES)
def test_the_server_still_requires_its_key(host, name):
    port = INSTANCES[name]
    assert http(port, "/get_model_info", key=None)[0] == 401
    assert http(port, "/get_model_info", key="wrong-key")[0] == 401
    other = KEYS["baseline" if name == "main" else "main"]
    assert http(port, "/get_model_info", key=other)[0] == 401  # per-instance keys
    assert http(port, "/get_model_info", key=KEYS[name])[0] == 200
    # As SGLang: health stays open for probes without secrets.
    assert http(port, "/health", key=None)[0] == 200


@pytest.mark.parametrize("name", INSTANCES)
def test_release_records_carry_no_key_and_no_plain_hash_of_it(host, name):
    release = host.file(f"/var/lib/sglang/{name}/current").linked_to
    key = KEYS[name]
    digest = host.check_output(f"sha256sum /etc/sglang/{name}.secrets.yaml").split()[0]
    for part in ("unit", "env", "argv.json", "release.json"):
        text = host.file(f"{release}/{part}").content_string
        assert key not in text, part
        assert digest not in text, part
        assert digest[:12] not in text, part
    assert json.loads(host.file(f"{release}/argv.json").content_string)[-2:] == [
        "--config", f"/run/credentials/sglang-{name}.service/secrets.yaml"]
    assert host.file(f"{release}/secrets.yaml").mode == 0o600
    assert host.file("/var/lib/sglang/.secrets-salt").mode == 0o600


# --- sandbox ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", INSTANCES)
def test_exposure_score_at_most_2_5(host, name):
    out = host.check_output(f"systemd-analyze security sglang-{name}.service --no-pager")
    line = [row for row in out.splitlines() if "Overall exposure level" in row][-1]
    score = float(line.split(":")[1].split()[0])
    assert score <= 2.5, out


@pytest.mark.parametrize("name", INSTANCES)
def test_sandbox_directives_in_effect(host, name):
    props = unit_properties(
        host, name, "SystemCallFilter RestrictNamespaces ProtectProc RemoveIPC PrivateMounts IPAddressDeny "
        "IPAddressAllow SystemCallErrorNumber"
    )
    assert "ioctl" in props["SystemCallFilter"]
    assert "mlock" in props["SystemCallFilter"]
    assert "mount" not in props["SystemCallFilter"].split()  # an allow list without @mount
    assert props["RestrictNamespaces"] == "yes"
    assert props["ProtectProc"] == "invisible"
    assert props["RemoveIPC"] == "yes"
    assert props["PrivateMounts"] == "yes"
    # systemd lists an address set in no fixed order.
    assert set(props["IPAddressDeny"].split()) == {"0.0.0.0/0", "::/0"}
    assert "127.0.0.0/8" in props["IPAddressAllow"]
    # ProtectProc=invisible: the service's user sees its own processes only, not root's sshd.
    pid = main_pid(host, name)
    assert host.run(f"nsenter -t {pid} -m runuser -u sglang -- ls /proc/1").rc != 0


def test_the_real_sglang_parser_runs_under_the_sandbox(host):
    """SGLang's own parser (check_args.py, importing torch and triton) in a copy of main's unit."""
    unit = host.file("/etc/systemd/system/sglang-main.service").content_string
    release = host.file("/var/lib/sglang/main/current").linked_to
    # The copy loads the same credential into its own credentials directory (%d of its unit).
    argv = host.file(f"{release}/argv.json").content_string.replace(
        "/run/credentials/sglang-main.service/", "/run/credentials/sglang-sandbox-check.service/")
    home = "/var/lib/sglang/main/home"
    host.run_test("printf '%%s' %s > %s && chown sglang:sglang %s", argv, f"{home}/argv-check.json",
                  f"{home}/argv-check.json")
    lines, skipping = [], False
    for line in unit.splitlines():
        if line.startswith(("ExecStart=", "Restart=", "Type=")):
            skipping = line.startswith("ExecStart=")
            continue
        if skipping:
            skipping = line.endswith("\\")
            continue
        lines.append(line)
        if line == "[Service]":
            python = "/opt/sglang/current/bin/python"
            lines += ["Type=oneshot", f"ExecStart={python} /usr/local/libexec/sglang-service/check_args.py "
                      f"{home}/argv-check.json"]
    copy = "\n".join(lines) + "\n"
    host.run_test("printf '%%s' %s > /run/systemd/system/sglang-sandbox-check.service", copy)
    try:
        host.run("systemctl daemon-reload")
        started = host.run("systemctl start sglang-sandbox-check.service")
        # journald takes the unit's last line asynchronously: on a loaded host it may land after
        # `systemctl start` returned. Read it again for up to 30 s.
        log = ""
        for _ in range(30):
            log = host.run("journalctl -u sglang-sandbox-check.service --no-pager -o cat -n 20").stdout
            if '{"ok": true' in log or started.rc != 0:
                break
            time.sleep(1)
        assert started.rc == 0, log
        assert '{"ok": true, "version": "0.5.23"}' in log, log
        assert "SystemCallFilter=" in host.check_output("systemctl cat sglang-sandbox-check.service")
    finally:
        host.run("rm -f /run/systemd/system/sglang-sandbox-check.service %s/argv-check.json", home)
        host.run("systemctl daemon-reload")


def test_the_simulator_runs_under_the_sandbox(host):
    pid = main_pid(host, "main")
    status = host.file(f"/proc/{pid}/status").content_string
    assert "Seccomp:\t2" in status  # a seccomp filter is attached
    assert "sglang_sim.launch_server" in host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    assert http(30004, "/health_generate")[0] == 200


def test_model_path_with_a_space_reaches_the_server(host):
    status, body = http(30004, "/get_model_info")
    assert status == 200, body
    assert json.loads(body)["model_path"] == MODEL


def test_hicache_only_on_main(host):
    main = json.loads(http(30004, "/get_server_info")[1])
    baseline = json.loads(http(30010, "/get_server_info")[1])
    assert main["enable_hierarchical_cache"] is True
    assert main["hicache_size"] == 2
    assert not baseline.get("enable_hierarchical_cache")


@pytest.mark.parametrize("name", INSTANCES)
def test_current_release_holds_the_installed_unit(host, name):
    current = host.file(f"/var/lib/sglang/{name}/current")
    assert current.is_symlink
    release = current.linked_to
    assert release.startswith(f"/var/lib/sglang/{name}/releases/")
    unit = host.file(f"/etc/systemd/system/sglang-{name}.service").content_string
    assert host.file(f"{release}/unit").content_string == unit
    assert host.file(f"{release}/env").mode == 0o600
    assert host.file(f"/var/lib/sglang/{name}/releases").mode == 0o700


# --- side_effect.yml ------------------------------------------------------------------------------
def side_effect_record(name: str = "side_effect.json") -> dict:
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / name
    assert path.exists(), f"{path} is missing: run `molecule side-effect -s sglang_service` before verify"
    return json.loads(path.read_text())


def steps() -> dict[str, dict]:
    return {step["name"]: step for step in side_effect_record()["steps"]}


CHANGES = [f"stream-interval {n}" for n in range(2, 7)]


def test_five_config_changes_in_a_row_all_restart_main():
    record = steps()
    runs = [record["before"]] + [record[name] for name in CHANGES]
    for step in runs[1:]:
        assert step["rc"] == 0, step["output"][-3000:]
        assert "attempted too often" not in step["output"], step["output"][-3000:]
        assert "changed=0" not in step["output"], step["output"][-3000:]
    for step in runs:
        unit = step["unit"]
        assert unit["ActiveState"] == "active", (step["name"], unit)
        assert unit["SubState"] == "running", (step["name"], unit)
        assert unit["NRestarts"] == "0", (step["name"], unit)  # no crash restarts
        # The limit for crash loops is still there.
        assert unit["StartLimitBurst"] == "3", unit
        assert unit["StartLimitIntervalUSec"] == "1h", unit
    # Each change restarted main on a new release, and the server runs the new setting.
    assert len({step["unit"]["MainPID"] for step in runs}) == len(runs)
    assert len({step["release"] for step in runs}) == len(runs)
    for number, name in enumerate(CHANGES, start=2):
        assert record[name]["server_info"]["stream_interval"] == number, record[name]["server_info"]
    # More deliberate restarts than StartLimitBurst allows, inside one StartLimitIntervalSec
    # (so without the reset the fourth would have been refused).
    assert len(CHANGES) > int(runs[0]["unit"]["StartLimitBurst"])
    first, last = datetime.fromisoformat(runs[1]["start"]), datetime.fromisoformat(runs[-1]["end"])
    assert (last - first).total_seconds() < 3600


def test_a_server_that_exits_at_start_fails_the_wait_early():
    record = side_effect_record()
    step = steps()["fault"]
    fault = side_effect_record("fault.json")
    assert step["rc"] != 0, step["output"][-3000:]
    assert fault["failed_task"].endswith("Wait | an instance did not become healthy"), fault
    polls = {poll["item"]["unit"]: poll for poll in fault["polls"]}
    main = polls["sglang-main.service"]
    assert main["healthy"] is False
    assert main["gave_up"] is True, main
    # It stopped at the unit's failure, long before the health budget ran out.
    assert main["attempts"] < record["health_retries"] / 2, main
    assert polls["sglang-baseline.service"]["healthy"] is True
    [message] = fault["messages"]
    assert message.startswith("sglang-main.service gave up waiting: "), message
    for word in ("ActiveState=", "SubState=", "Result=", "NRestarts=", "exit status 1"):
        assert word in message, message
    # The journal's last lines: the server's own startup error.
    assert "Not enough host memory available" in message, message
    assert "[sglang-sim SIMULATOR fault startup_exit]" in message, message
    # The unit logged its key (ExecStartPre, from the secrets file): the message shows it redacted.
    assert '"api-key": "<redacted>"' in message, message


def test_no_api_key_in_the_failed_runs_output():
    record = side_effect_record()
    fault = side_effect_record("fault.json")
    output = steps()["fault"]["output"]
    assert "<redacted>" in output  # the message was printed
    for key in record["keys"]:
        assert key not in output
        assert key not in json.dumps(fault["messages"])


def test_the_good_config_is_back_after_the_fault(host):
    record = steps()
    restored = record["restored"]
    assert restored["rc"] == 0, restored["output"][-3000:]
    assert restored["release"] == record["before"]["release"]
    assert restored["unit"]["ActiveState"] == "active"
    assert "SGLANG_SIM_FAULT" not in host.file("/etc/sglang/main.env").content_string
    assert http(30004, "/health_generate")[0] == 200, journal(host, "main")


def test_check_diff_shows_the_change_and_restarts_nothing(host):
    before = {name: main_pid(host, name) for name in INSTANCES}
    unit_before = host.file("/etc/systemd/system/sglang-main.service").content_string
    run = playbook(
        "converge.yml", {"sglang_service_instances": instances({"--stream-interval": 4})}, "--check", "--diff"
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert "+    --stream-interval 4" in run.stdout, run.stdout[-3000:]
    assert "-    --stream-interval 1" in run.stdout
    assert "would restart sglang-main.service" in run.stdout
    assert {name: main_pid(host, name) for name in INSTANCES} == before
    assert host.file("/etc/systemd/system/sglang-main.service").content_string == unit_before


BAD = {
    "unknown flag": (
        {"sglang_service_instances": instances({"--no-such-flag": 1})},
        "unrecognized arguments: --no-such-flag",
    ),
    "ambiguous --cuda-graph-bs": (
        {"sglang_service_instances": instances({"--cuda-graph-bs-decode": None, "--cuda-graph-bs": [1, 2]})},
        "ambiguous option: --cuda-graph-bs",
    ),
    "hicache-size 0.5": (
        {"sglang_service_hicache_args": {**HICACHE, "--hicache-size": 0.5}},
        "argument --hicache-size: invalid int value: '0.5'",
    ),
    "buffer_only without storage": (
        {"sglang_service_hicache_args": {**HICACHE, "--hicache-host-memory-mode": "buffer_only"}},
        "--hicache-host-memory-mode buffer_only requires a storage backend (--hicache-storage-backend)",
    ),
    "host pool larger than RAM": (
        {"sglang_service_hicache_args": {**HICACHE, "--hicache-size": 64}},
        "not enough RAM for the HiCache host pools: they need 128 GB of pinned RAM",
    ),
    "negative hicache-ratio (SGLang's parser takes it; preflight's ranges do not)": (
        {"sglang_service_hicache_args": {**HICACHE, "--hicache-size": 0, "--hicache-ratio": "-0.5"}},
        "argument --hicache-ratio: -0.5 is out of range (must be > 0)",
    ),
    "mem-fraction-static 1.2": (
        {"sglang_service_instances": instances({"--mem-fraction-static": "1.2"})},
        "argument --mem-fraction-static: 1.2 is out of range (must be < 1)",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_profile_fails_before_restart_and_old_service_keeps_serving(host, case):
    extra, message = BAD[case]
    before = {name: main_pid(host, name) for name in INSTANCES}
    unit_before = host.file("/etc/systemd/system/sglang-main.service").content_string
    run = playbook("converge.yml", extra)
    output = " ".join((run.stdout + run.stderr).split())
    assert run.returncode != 0, run.stdout[-3000:]
    assert message in output, run.stdout[-3000:]
    assert {name: main_pid(host, name) for name in INSTANCES} == before
    assert host.file("/etc/systemd/system/sglang-main.service").content_string == unit_before
    for port in INSTANCES.values():
        assert http(port, "/health")[0] == 200


def test_change_restarts_only_main_then_rollback_restores_it(host):
    before = {name: main_pid(host, name) for name in INSTANCES}
    first_release = host.file("/var/lib/sglang/main/current").linked_to
    run = playbook("converge.yml", {"sglang_service_instances": instances({"--stream-interval": 4})})
    assert run.returncode == 0, run.stdout[-3000:]
    assert main_pid(host, "main") != before["main"]
    assert main_pid(host, "baseline") == before["baseline"]
    assert "--stream-interval 4" in host.file("/etc/systemd/system/sglang-main.service").content_string
    assert host.file("/var/lib/sglang/main/previous").linked_to == first_release
    assert json.loads(http(30004, "/get_server_info")[1])["stream_interval"] == 4

    changed_pid = main_pid(host, "main")
    run = playbook("rollback.yml", {"sglang_service_rollback_instances": ["main"]})
    assert run.returncode == 0, run.stdout[-3000:]
    assert host.file("/var/lib/sglang/main/current").linked_to == first_release
    assert "--stream-interval 1" in host.file("/etc/systemd/system/sglang-main.service").content_string
    assert main_pid(host, "main") != changed_pid
    assert main_pid(host, "baseline") == before["baseline"]
    assert http(30004, "/health_generate")[0] == 200
    # Back on the converged config: a converge run changes nothing.
    run = playbook("converge.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "changed=0" in run.stdout, run.stdout[-3000:]


# --- every key, in every file (issue 24): last, after the side effect and verify's own runs --------
def test_no_key_in_any_file_but_its_secrets_files(host):
    """The scenario's keys (-e, group_vars, per instance, the side effect's) searched in every file of the
    host (a whole-filesystem grep, /proc, /sys and /dev left out) and in what the runs wrote on the
    controller (the scenario's ephemeral directory: inventory, reports): only secrets files hold one,
    none readable by other users; the journal holds the keys SGLang (here: the simulator, and the side
    effect's ExecStartPre) logs, readable by root and the systemd-journal group only: on systemd 252 no
    LogFilterPatterns= (roles/sglang_service/README.md, "Where secrets live").
    The search: molecule/resources/secret_search.py, shared with molecule/ab_benchmark."""
    keys = sorted(set(KEYS.values()) | set(side_effect_record()["keys"]))
    hits = secret_search.host_hits(host, keys)
    paths = [hit.path for hit in hits]
    assert "/etc/sglang/main.secrets.yaml" in paths, paths  # the search finds what is there
    wrong = secret_search.misplaced(hits)
    assert not wrong, "a key in files other than its secrets files: " + ", ".join(map(str, wrong))
    controller = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
    leaked = secret_search.controller_hits([controller], keys, skip=[controller / "side_effect.json"])
    assert not leaked, leaked
