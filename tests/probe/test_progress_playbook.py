"""A long probe in the background with its rounds printed as they come: the module async, the entry
point probe_progress of roles/sglang_service (called by roles/rollout_gate's gate and by the role's
own A/B) per round, its argument spec checked, then async_status, through ansible-playbook against a
fake server."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from plugins import ROOT as REPO
from plugins import ansible_bin, ansible_env
from probe_fakes import FakeServer

PLAYBOOK = """\
- name: Background probe, rounds printed
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    rounds: 3
    progress: "{progress}"
  tasks:
    - name: Probe in the background
      sglang_cache_probe: {args}
      async: 120
      poll: 0
      register: job
      changed_when: false
    - name: Each round
      ansible.builtin.include_role:
        name: sglang_service
        tasks_from: probe_progress
      vars:
        sglang_service_probe_progress:
          label: "fake main"
          job: "{{{{ job.ansible_job_id }}}}"
          path: "{{{{ progress }}}}"
          round: "{{{{ item }}}}"
          rounds: "{{{{ rounds }}}}"
          timeout: 60
      loop: "{{{{ range(1, rounds + 1) | list }}}}"
    - name: The result
      ansible.builtin.async_status:
        jid: "{{{{ job.ansible_job_id }}}}"
      register: result
      until: result.finished
      retries: 60
      delay: 1
    - name: Save it
      ansible.builtin.copy:
        content: "{{{{ result | to_json }}}}"
        dest: "{dest}"
        mode: "0600"
"""


def run(tmp_path, args: dict) -> tuple[subprocess.CompletedProcess, dict | None]:
    dest = tmp_path / "result.json"
    playbook = tmp_path / "progress.yml"
    playbook.write_text(PLAYBOOK.format(args=json.dumps(args), progress=args["progress_path"], dest=dest))
    proc = subprocess.run([ansible_bin("ansible-playbook"), "-i", "localhost,", str(playbook),
                           "-e", json.dumps({"ansible_python_interpreter": sys.executable})],
                          cwd=REPO, env=ansible_env(tmp_path), capture_output=True, text=True, timeout=300)
    return proc, (json.loads(dest.read_text()) if dest.exists() else None)


def test_each_round_is_printed_then_the_result(tmp_path):
    progress = tmp_path / "probe.progress"
    with FakeServer(capacity=1200, s_per_token=0.0005) as srv:
        args = {"url": srv.url, "input_len": 1000, "cold_output_len": 2, "warm_output_len": 2, "repeats": 3,
                "max_warm_cold_ratio": 0.9, "ready_timeout": 5, "progress_path": str(progress)}
        proc, result = run(tmp_path, args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = re.findall(r"msg: '?(fake main (?:round \d/3|end)): ([^\n]*)", proc.stdout)
    assert [label for label, _ in printed] == ["fake main round 1/3", "fake main round 2/3",
                                               "fake main round 3/3"], proc.stdout
    assert printed[0][1].startswith("cold TTFT ")
    assert "warm device TTFT" in printed[0][1]
    # the rounds are printed before the result is collected
    assert proc.stdout.index("fake main round 3/3") < proc.stdout.index("TASK [The result]")
    assert result["finished"] == 1
    assert result["gate"]["passed"] is True
    assert result["cold"]["completed"] == 3


def test_a_probe_that_fails_early_ends_the_rounds(tmp_path):
    progress = tmp_path / "probe.progress"
    args = {"url": "http://127.0.0.1:9", "ready_timeout": 1, "repeats": 3, "progress_path": str(progress)}
    proc, result = run(tmp_path, args)
    assert proc.returncode != 0  # async_status carries the probe's failure
    printed = re.findall(r"msg: '?fake main ([^\n]*)", proc.stdout)
    assert len(printed) == 1, proc.stdout
    assert printed[0].startswith("end: error: cannot connect to http://127.0.0.1:9")
    assert result is None
