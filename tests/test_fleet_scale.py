"""benchmarks/fleet_scale.py without a fleet: its parsers on captured ansible-playbook output (the serial
batches and their stamps, PLAY RECAP per host, the demo hosts up), the change it makes, the batch
play it looks for, and that it skips (exit 0, nothing recorded) when its fleet is not up."""

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
