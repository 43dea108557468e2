"""benchmarks/fleet_scale.py without a fleet: its parsers on captured ansible-playbook output (the serial
batches and their stamps, PLAY RECAP per host, the demo hosts up), the change it makes, the batch
play it looks for, and that it skips (exit 0, nothing recorded) when its fleet is not up; Ansible's
floor (the ping play, how it runs, its printed lines) and the test hosts' CPU (guest_seconds over a
fake /proc and over the real one, cpu_split_line)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fleet_scale  # noqa: E402
import record  # noqa: E402

BIN = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"

# What `ansible-playbook site.yml` prints for a change on four hosts with rollout_batches [1, 1, "100%"]
# (cut down: the task results of each play, the banners, the recap), one stamp per line.
SAMPLE = """\
PLAY [Converged hosts skip the run (their recorded release is the desired one, nothing drifted)] ***

TASK [Converged | which hosts skip this run (roles/rollout)] *******************
included: rollout for demo-1, demo-2, demo-3, demo-4

PLAY [Rollout | stage every host's release (in parallel; nothing live changes)] ***

TASK [Gathering Facts] *********************************************************
ok: [demo-1]
ok: [demo-2]
ok: [demo-3]
ok: [demo-4]

PLAY [Rollout | the hosts that do not change, all at once] *********************
skipping: no hosts matched

PLAY [Rollout | gated activation of the hosts that change, batch by batch] *****

TASK [Rollout | the instances that restart or are probed leave the router] *****
included: rollout for demo-1

TASK [rollout : Router | the workers it routes to] *****************************
ok: [demo-1 -> localhost]

TASK [sglang_service : Activate | restart what changed] ************************
changed: [demo-1]

PLAY [Rollout | gated activation of the hosts that change, batch by batch] *****

TASK [sglang_service : Activate | restart what changed] ************************
changed: [demo-2]

TASK [rollout : Probe | cold and warm] *****************************************
ok: [demo-2] => (item=main)

PLAY [Rollout | gated activation of the hosts that change, batch by batch] *****

TASK [sglang_service : Activate | restart what changed] ************************
changed: [demo-3]
changed: [demo-4]

TASK [rollout : Probe | cold and warm] *****************************************
ok: [demo-4]
ok: [demo-3]

PLAY [Rollout | summary] *******************************************************

TASK [Rollout | write the report] **********************************************
ok: [demo-1 -> localhost]

PLAY RECAP *********************************************************************
demo-1                     : ok=241  changed=21   unreachable=0    failed=0    skipped=98   rescued=0    ignored=0
demo-2                     : ok=239  changed=20   unreachable=0    failed=0    skipped=99   rescued=0    ignored=0
demo-3                     : ok=238  changed=20   unreachable=0    failed=0    skipped=99   rescued=0    ignored=0
demo-4                     : ok=238  changed=20   unreachable=0    failed=0    skipped=100  rescued=1    ignored=0
localhost                  : ok=3    changed=0    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
"""


def stamped(text: str) -> list[tuple[float, str]]:
    """Each line stamped one second after the one before."""
    return [(float(i), line) for i, line in enumerate(text.splitlines())]


def line_of(text: str, needle: str, nth: int = 1) -> int:
    found = [i for i, line in enumerate(text.splitlines()) if line.startswith(needle)]
    return found[nth - 1]


def test_batches_are_cut_at_the_batch_plays_banners_with_their_hosts_and_stamps():
    found = fleet_scale.batches(stamped(SAMPLE))
    assert [b.hosts for b in found] == [["demo-1"], ["demo-2"], ["demo-3", "demo-4"]]
    banner = "PLAY [Rollout | gated activation"
    assert [b.start for b in found] == [line_of(SAMPLE, banner, n) for n in (1, 2, 3)]
    # Each batch ends where the next banner starts: the next batch, then the summary play.
    assert [b.end for b in found] == [found[1].start, found[2].start, line_of(SAMPLE, "PLAY [Rollout | summary]")]
    assert [b.seconds for b in found] == [b.end - b.start for b in found]
    # The summary play's delegated result is no batch's.
    assert all("localhost" not in b.hosts for b in found)


def test_no_batch_in_a_run_where_every_host_is_converged():
    converged = (
        "PLAY [Converged hosts skip the run (their recorded release is the desired one, nothing drifted)] ***\n\n"
        "TASK [Converged | nothing to do on any host] ***\nok: [demo-1] => \n  msg: Every host of this run is "
        "converged (12)\n\nPLAY RECAP ***\ndemo-1                     : ok=5    changed=0    unreachable=0    "
        "failed=0    skipped=9    rescued=0    ignored=0\n"
    )
    assert fleet_scale.batches(stamped(converged)) == []


def test_a_run_cut_inside_a_batch_ends_that_batch_at_its_last_line():
    cut = SAMPLE.split("PLAY [Rollout | summary]")[0].rstrip("\n")
    found = fleet_scale.batches(stamped(cut))
    assert len(found) == 3
    assert found[-1].end == len(cut.splitlines()) - 1


def test_recap_by_host_reads_every_counter_of_every_host():
    recap = fleet_scale.rollout_rerun.recap_by_host(SAMPLE)
    assert set(recap) == {"demo-1", "demo-2", "demo-3", "demo-4", "localhost"}
    assert recap["demo-1"] == {"ok": 241, "changed": 21, "unreachable": 0, "failed": 0, "skipped": 98,
                               "rescued": 0, "ignored": 0}
    assert recap["demo-4"]["rescued"] == 1
    assert fleet_scale.rollout_rerun.recap_by_host("no recap here\ndemo-1 : ok=1 changed=0") == {}
    # The totals rollout_rerun.recap gives are the sums of these.
    assert fleet_scale.rollout_rerun.recap(SAMPLE)[0] == sum(r["ok"] for r in recap.values())


def test_recap_by_host_reads_the_last_recap_only():
    earlier = "PLAY RECAP ***\ndemo-9                     : ok=1    changed=0    unreachable=0    failed=0    " \
              "skipped=0    rescued=0    ignored=0\n"
    hosts = set(fleet_scale.rollout_rerun.recap_by_host(earlier + SAMPLE))
    assert hosts == {"demo-1", "demo-2", "demo-3", "demo-4", "localhost"}


def test_hosts_up_is_the_running_demo_hosts_from_demo_1_without_a_gap():
    listing = "\n".join([
        "demo-1\t127.0.30.1\trunning", "demo-10\t127.0.30.10\trunning", "demo-2\t127.0.30.2\trunning",
        "demo-3\t127.0.30.3\trunning", "demo-4\t127.0.30.4\tstopped", "demo-5\t127.0.30.5\trunning",
        "rollout-1\t127.0.17.1\trunning",
    ]) + "\n"
    assert fleet_scale.hosts_up(listing, 12) == ["demo-1", "demo-2", "demo-3"]
    assert fleet_scale.hosts_up(listing, 2) == ["demo-1", "demo-2"]
    full = "".join(f"demo-{i}\t127.0.30.{i}\trunning\n" for i in range(1, 15))
    assert fleet_scale.hosts_up(full, 12) == [f"demo-{i}" for i in range(1, 13)]
    assert fleet_scale.hosts_up("", 12) == []


def test_the_change_is_the_demo_environment_plus_one_variable():
    demo = yaml.safe_load((ROOT / "inventories" / "demo" / "group_vars" / "sglang_hosts" / "demo.yml").read_text())
    overlay = fleet_scale.change_overlay(demo)
    assert list(overlay) == ["sglang_service_environment"]
    env = overlay["sglang_service_environment"]
    assert env.pop("HICACHE_FLEET_BENCH") == "fleet-wide change"
    assert env == demo["sglang_service_environment"]


def test_the_batch_play_it_cuts_at_is_the_rollouts_serial_play():
    plays = yaml.safe_load((ROOT / "playbooks" / "rollout.yml").read_text())
    serial = [p["name"] for p in plays if "serial" in p]
    assert serial == [fleet_scale.rollout_rerun.BATCH_PLAY]


def test_the_fleet_passes_the_extra_hosts_after_the_demo_inventory(tmp_path):
    fleet = fleet_scale.Fleet([f"demo-{i}" for i in range(1, 13)], tmp_path)
    assert fleet.inventory_args() == ["-i", str(ROOT / "inventories" / "demo"), "-i", str(tmp_path / "hosts-extra.yml")]
    assert fleet.limit is None
    assert list(yaml.safe_load((tmp_path / "hosts-extra.yml").read_text())["sglang_hosts"]["hosts"])[-1] == "demo-12"
    small = fleet_scale.Fleet(["demo-1", "demo-2"], tmp_path / "small")
    assert small.inventory_args() == ["-i", str(ROOT / "inventories" / "demo")]
    assert small.limit == "demo-1,demo-2"


def test_record_run_of_a_skipped_benchmark_exits_0_and_writes_nothing(tmp_path, capsys):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("<!-- BEGIN recorded: x -->\nold\n<!-- END recorded: x -->\n")

    def main() -> int:
        print("half a line")
        raise record.Skipped("no fleet")

    for argv in (["--record"], []):
        assert record.run(main, "x", doc=doc, argv=argv) == 0
        assert "x: skipped: no fleet" in capsys.readouterr().out
    assert doc.read_text() == "<!-- BEGIN recorded: x -->\nold\n<!-- END recorded: x -->\n"


@pytest.mark.parametrize("args", [["--record"], ["--hosts", "3", "--record"]])
def test_without_its_fleet_up_the_benchmark_skips_and_records_nothing(tmp_path, args):
    doc = ROOT / "docs" / "benchmarks.md"
    before = doc.read_text(encoding="utf-8")
    # hosts.sh reads its hosts from HICACHE_FLEET_CACHE: an empty one has none up.
    env = {**os.environ, "HICACHE_FLEET_CACHE": str(tmp_path)}
    done = subprocess.run([str(BIN / "python"), str(ROOT / "benchmarks" / "fleet_scale.py"), *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    wanted = args[1] if args[0] == "--hosts" else "12"
    assert f"fleet_scale: skipped: a demo fleet of {wanted} is not up" in done.stdout
    assert f"make demo DEMO_HOSTS={wanted} first" in done.stdout
    assert doc.read_text(encoding="utf-8") == before


def test_a_bad_hosts_count_is_refused():
    done = subprocess.run([str(BIN / "python"), str(ROOT / "benchmarks" / "fleet_scale.py"), "--hosts", "0"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 2
    assert "--hosts: DEMO_HOSTS must be an integer from 1 to 40" in done.stderr


def test_real_ansible_output_of_a_serial_play_is_cut_into_its_batches_with_their_times(tmp_path):
    """The real ansible-playbook, through the benchmark's own line-by-line reader: a play with the batch
    play's name and rollout_batches' serial over four local hosts prints its banner once per batch."""
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        for name in ("demo-1", "demo-2", "demo-3", "demo-4")}}}))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([
        {"name": "Before", "hosts": "all", "gather_facts": False,
         "tasks": [{"name": "Nothing", "ansible.builtin.debug": {"msg": "x"}}]},
        {"name": fleet_scale.rollout_rerun.BATCH_PLAY, "hosts": "all", "gather_facts": False,
         "serial": [1, 1, "100%"],
         "tasks": [{"name": "Take a while", "ansible.builtin.command": "sleep 0.5", "changed_when": False}]},
        {"name": "After", "hosts": "all", "gather_facts": False,
         "tasks": [{"name": "Nothing", "ansible.builtin.debug": {"msg": "x"}}]},
    ], sort_keys=False))
    done = fleet_scale.stamped([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                                str(tmp_path / "play.yml")], timeout=300)
    assert done.rc == 0, done.stdout
    found = fleet_scale.batches(done.lines)
    # A batch's hosts in the order their results came (the last batch's two finish in either order).
    assert [sorted(b.hosts) for b in found] == [["demo-1"], ["demo-2"], ["demo-3", "demo-4"]], done.stdout
    assert all(b.seconds >= 0.5 for b in found), [b.seconds for b in found]
    assert found[0].start < found[1].start < found[2].start < found[2].end <= done.wall
    assert {h: r["ok"] for h, r in fleet_scale.rollout_rerun.recap_by_host(done.stdout).items()} == {
        "demo-1": 3, "demo-2": 3, "demo-3": 3, "demo-4": 3}


def test_real_ansible_output_is_counted_per_role_on_one_host(tmp_path):
    """rollout_rerun's breakdown of a one-host change, on the real ansible-playbook output of two roles
    on two local hosts: a loop counts once, a task skipped on the host does not count, a task delegated
    to localhost counts for the host it ran for, the other host's tasks are not counted."""
    hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
             for name in ("demo-1", "demo-2")}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    for role, tasks in {
        "alpha": [{"name": "Loop", "ansible.builtin.debug": {"msg": "{{ item }}"}, "loop": [1, 2, 3]},
                  {"name": "Only demo-1", "ansible.builtin.debug": {"msg": "x"},
                   "when": "inventory_hostname == 'demo-1'"}],
        "beta": [{"name": "Delegated", "ansible.builtin.command": "true", "changed_when": False,
                  "delegate_to": "localhost"}],
    }.items():
        (tmp_path / "roles" / role / "tasks").mkdir(parents=True)
        (tmp_path / "roles" / role / "tasks" / "main.yml").write_text(yaml.safe_dump(tasks, sort_keys=False))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([
        {"name": "Two roles", "hosts": "all", "gather_facts": False,
         "tasks": [{"name": "Own task", "ansible.builtin.debug": {"msg": "x"}},
                   {"ansible.builtin.include_role": {"name": "alpha"}},
                   {"ansible.builtin.include_role": {"name": "beta"}}]},
    ], sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(tmp_path / "roles")}
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                           str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    by_role = fleet_scale.rollout_rerun.tasks_by_role(done.stdout, "demo-2")
    assert by_role == {"(play)": 1, "alpha": 1, "beta": 1}, done.stdout
    assert fleet_scale.rollout_rerun.tasks_by_role(done.stdout, "demo-1") == {"alpha": 2, "(play)": 1, "beta": 1}
    assert fleet_scale.rollout_rerun.tasks_by_role(done.stdout, "demo-9") == {}


def test_the_install_phases_left_out_are_read_from_the_fast_paths_message():
    """converged.yml's message, a line per host, as ansible-playbook prints it (the YAML callback wraps it)."""
    out = ("ok: [demo-1] => \n    msg:\n"
           "    - 'demo-2: runs every phase but models, rocm, venv (current): the desired release\n"
           "        changed since the last whole run'\n"
           "    - 'demo-3: runs every phase: the desired release changed since the last whole run'\n"
           "    - 'demo-4: converged: its recorded release is the desired one and nothing drifted;\n"
           "        every phase is skipped'\n")
    assert fleet_scale.rollout_rerun.phases_left_out(out, "demo-2") == ["models", "rocm", "venv"]
    assert fleet_scale.rollout_rerun.phases_left_out(out, "demo-3") == []
    assert fleet_scale.rollout_rerun.phases_left_out(out, "demo-1") == []
    assert fleet_scale.rollout_rerun.skipped_as_converged(out) == ["demo-4"]


# --- Ansible's floor and the CPU split between the test hosts and the controller ---------------------

def stat_line(pid: int, comm: str, utime: int, stime: int, cutime: int, cstime: int) -> str:
    """A /proc/PID/stat line as the kernel writes it: pid (comm) state, then fields 4.. (14-17 the times)."""
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", "812", "0", "3", "0",
              str(utime), str(stime), str(cutime), str(cstime), "20", "0", "1", "0", "105028", "2654208", "386"]
    return f"{pid} ({comm}) {' '.join(fields)}\n"


def fake_process(root: Path, pid: int | str, ns: str | None, stat: str | None) -> None:
    entry = root / str(pid)
    entry.mkdir()
    if ns is not None:
        (entry / "ns").mkdir()
        (entry / "ns" / "pid").symlink_to(ns)
    if stat is not None:
        (entry / "stat").write_text(stat)


def test_guest_seconds_sums_the_times_of_the_processes_in_other_pid_namespaces(tmp_path, monkeypatch):
    (tmp_path / "self" / "ns").mkdir(parents=True)
    (tmp_path / "self" / "ns" / "pid").symlink_to("pid:[1]")
    # Two test-host processes; their comm holds spaces and ')' (and numbers after one): only the
    # fields after the last ')' are the stat's.
    fake_process(tmp_path, 101, "pid:[2]", stat_line(101, "sglang (main) 7 8 9) x", 150, 30, 7, 3))
    fake_process(tmp_path, 102, "pid:[2]", stat_line(102, "a) 1 2 3 4 5 6 7 8 9 10 11 12 13 14 (b", 1200, 300, 0, 50))
    # The controller's own namespace: not counted.
    fake_process(tmp_path, 1, "pid:[1]", stat_line(1, "ansible-playbook", 90000, 9000, 900, 90))
    # Vanished between the listing and the reading: no stat, no ns link, a stat cut short, no ')' at all,
    # and a stat that cannot be read (a directory).
    fake_process(tmp_path, 201, "pid:[2]", None)
    fake_process(tmp_path, 202, None, stat_line(202, "gone", 5000, 0, 0, 0))
    fake_process(tmp_path, 203, "pid:[2]", "203 (cut) S 1 203 203 0 -1 4194560 812 0 3 0 5000\n")
    fake_process(tmp_path, 204, "pid:[2]", "204 (cut\n")
    fake_process(tmp_path, 205, "pid:[2]", None)
    (tmp_path / "205" / "stat").mkdir()
    # What /proc holds beside the processes is no process.
    (tmp_path / "stat").write_text("cpu  1 2 3 4\n")
    (tmp_path / "sys").mkdir()
    ticks = (150 + 30 + 7 + 3) + (1200 + 300 + 0 + 50)
    assert fleet_scale.guest_seconds(tmp_path) == ticks / os.sysconf("SC_CLK_TCK")
    assert fleet_scale.guest_seconds(str(tmp_path)) == ticks / os.sysconf("SC_CLK_TCK")
    monkeypatch.setattr(fleet_scale.os, "sysconf", lambda name: {"SC_CLK_TCK": 100}[name])
    assert fleet_scale.guest_seconds(tmp_path) == 17.4


def test_guest_seconds_on_the_real_proc_counts_a_process_in_its_own_pid_namespace_only(tmp_path):
    """The kernel's own ns/pid links and stat: a process started in a new PID namespace (unshare, root
    only) counts, the controller's own processes (this one) do not."""
    burn = ("import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.2:\n    pass\n"
            "print('ready', flush=True)\nsys.stdin.read()\n")
    try:
        proc = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", burn], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        pytest.skip("no unshare")
    try:
        if proc.stdout.readline() != "ready\n":
            pytest.skip(f"unshare --pid cannot start a process in a new PID namespace here: {proc.stderr.read()}")
        child = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])

        def ticks() -> int:
            stat = Path(f"/proc/{child}/stat").read_text()
            return sum(int(n) for n in stat.rsplit(")", 1)[1].split()[11:15])

        (tmp_path / "self").symlink_to("/proc/self")
        for pid in (child, os.getpid(), proc.pid):  # the unshare process is in the controller's namespace
            (tmp_path / str(pid)).symlink_to(f"/proc/{pid}")
        before = ticks()
        assert before >= 0.15 * os.sysconf("SC_CLK_TCK")  # it burned 0.2 s of CPU before it said ready
        assert fleet_scale.guest_seconds(tmp_path) == before / os.sysconf("SC_CLK_TCK")
        assert ticks() == before  # it sleeps on its stdin: nothing moved during the reading
    finally:
        proc.kill()
        proc.wait()


def test_cpu_split_line_prints_the_total_per_changed_host_as_test_hosts_plus_controller():
    assert fleet_scale.cpu_split_line(393.8, 240.0, 12) == (
        "    per changed host: 32.8 CPU s = 20.0 test-host CPU s + 12.8 controller CPU s (test hosts 61%: "
        "processes in other PID namespaces than the controller's, a lower bound)")
    assert fleet_scale.cpu_split_line(36.0, 9.0, 1) == (
        "    per changed host: 36.0 CPU s = 9.0 test-host CPU s + 27.0 controller CPU s (test hosts 25%: "
        "processes in other PID namespaces than the controller's, a lower bound)")
    assert fleet_scale.cpu_split_line(0.0, 0.0, 3).startswith(
        "    per changed host: 0.0 CPU s = 0.0 test-host CPU s + 0.0 controller CPU s (test hosts n/a: ")
    with pytest.raises(ValueError, match="hosts must be at least 1"):
        fleet_scale.cpu_split_line(10.0, 5.0, 0)


def test_floor_lines_set_the_floor_beside_the_rerun_with_its_own_ratio_and_share_of_the_growth():
    assert fleet_scale.floor_lines(12, 2, [0.61, 0.59], [1.32, 1.28], 2.0, 4.3) == [
        "Ansible's floor on the same hosts (one ansible.builtin.ping per host, gather_facts: false; medians of 2):",
        "  1 host (--limit demo-1)    0.60 s (runs: 0.61, 0.59 s); the re-run 2.0 s = 3.3x the floor",
        "  12 hosts                   1.30 s (runs: 1.32, 1.28 s); the re-run 4.3 s = 3.3x the floor",
        "  floor 12 hosts / 1 host: 2.17x (the re-run's 2.15x); from 1 to 12 hosts the re-run grows 2.3 s, "
        "the floor 0.70 s (30% of the re-run's growth)",
    ]
    assert fleet_scale.floor_lines(3, 1, [0.5], [0.6], 2.0, 2.0)[-1] == (
        "  floor 3 hosts / 1 host: 1.20x (the re-run's 1.00x); the re-run does not grow from 1 to 3 hosts "
        "(the floor +0.10 s)")


def test_the_floor_play_is_one_ping_per_host_without_facts():
    plays = yaml.safe_load(fleet_scale.FLOOR_PLAY)
    assert plays == [{"name": "Ansible floor (one ping per host)", "hosts": "sglang_hosts", "gather_facts": False,
                      "tasks": [{"name": "Ping", "ansible.builtin.ping": None}]}]


def test_the_floor_play_runs_one_task_per_host_under_the_real_ansible_playbook(tmp_path):
    """The floor's play through the benchmark's own runner (ANSIBLE_CONFIG the checkout's), on three
    local hosts of sglang_hosts: one ok per host, no facts, limited as the 1-host figure is."""
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"sglang_hosts": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        for name in ("demo-1", "demo-2", "demo-3")}}}))
    (tmp_path / "floor.yml").write_text(fleet_scale.FLOOR_PLAY)
    argv = [str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "floor.yml")]
    done = fleet_scale.stamped(argv, timeout=300)
    assert done.rc == 0, done.stdout
    assert {h: (r["ok"], r["changed"]) for h, r in fleet_scale.rollout_rerun.recap_by_host(done.stdout).items()} == {
        "demo-1": (1, 0), "demo-2": (1, 0), "demo-3": (1, 0)}, done.stdout
    assert "Gathering Facts" not in done.stdout
    one = fleet_scale.stamped([*argv, "--limit", "demo-1"], timeout=300)
    assert {h: r["ok"] for h, r in fleet_scale.rollout_rerun.recap_by_host(one.stdout).items()} == {"demo-1": 1}


def test_the_floor_runs_as_site_yml_does_with_the_same_inventory_and_limit(tmp_path, monkeypatch):
    argvs = []
    monkeypatch.setattr(fleet_scale, "stamped", lambda argv: argvs.append(argv) or fleet_scale.Run(0, 1.0, 0.0, []))
    fleet = fleet_scale.Fleet([f"demo-{i}" for i in range(1, 13)], tmp_path)
    floor = tmp_path / "floor.yml"
    fleet.site(limit="demo-1")
    fleet.site(limit="demo-1", playbook=floor)
    fleet.site(playbook=floor)
    inventory = ["-i", str(ROOT / "inventories" / "demo"), "-i", str(tmp_path / "hosts-extra.yml")]
    playbook = str(fleet_scale.BIN / "ansible-playbook")
    assert argvs == [[playbook, *inventory, str(ROOT / "site.yml"), "--limit", "demo-1"],
                     [playbook, *inventory, str(floor), "--limit", "demo-1"],
                     [playbook, *inventory, str(floor)]]


def test_no_change_measures_the_floor_after_each_rerun_from_a_temp_play_it_removes():
    converged = ("ok: [demo-1] => \n    msg:\n    - 'demo-1: converged: its recorded release is the desired one'\n"
                 "PLAY RECAP ***\ndemo-1                     : ok=7    changed=0    unreachable=0    failed=0\n")

    class FakeFleet:
        def __init__(self) -> None:
            self.hosts = [f"demo-{i}" for i in range(1, 13)]
            self.calls: list[tuple[str | None, str]] = []
            self.plays: list[Path] = []
            self.walls = iter([2.0, 0.61, 1.9, 0.59, 4.3, 1.32, 4.4, 1.28])

        def checked_site(self, what, limit=None, playbook=None):
            if playbook is not None:
                assert playbook.read_text() == fleet_scale.FLOOR_PLAY
                self.plays.append(playbook)
            self.calls.append((limit, "floor" if playbook else "site"))
            return fleet_scale.Run(0, next(self.walls), 0.0, [(0.0, line) for line in converged.splitlines()])

    fleet = FakeFleet()
    lines = fleet_scale.no_change(fleet, 2)
    assert fleet.calls == [("demo-1", "site"), ("demo-1", "floor")] * 2 + [(None, "site"), (None, "floor")] * 2
    assert len(set(fleet.plays)) == 1
    assert not fleet.plays[0].exists()
    assert lines[:4] == [
        "no-change re-run of site.yml on the converged fleet (medians of 2):",
        # The medians 1.95 and 4.35 s (printed as their floats round: 1.9 and 4.3), their ratio 2.23.
        "  1 host (--limit demo-1)     1.9 s (runs: 2.0, 1.9 s); skipped as converged 1/1; 7 tasks ok",
        "  12 hosts                    4.3 s (runs: 4.3, 4.4 s); skipped as converged 1/12; 7 tasks ok",
        "  12 hosts / 1 host: 2.23x (target <= 1.5x)",
    ]
    assert lines[4:] == fleet_scale.floor_lines(12, 2, [0.61, 0.59], [1.32, 1.28], 1.95, 4.35)
