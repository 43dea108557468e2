"""playbooks/ab_benchmark.yml reads the live release's interpreter and model paths with these filters."""

from __future__ import annotations

from pathlib import Path

import pytest
from plugins import load

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    return load(path, name)


AB = _load("ab_benchmark_filters", ROOT / "playbooks" / "filter_plugins" / "ab_benchmark.py")
SERVICE = _load("sglang_service_filters_ab", ROOT / "roles" / "sglang_service" / "filter_plugins" / "sglang_service.py")

UNIT = """# Ansible managed
[Service]
Type=exec
Environment=PYTHONUNBUFFERED=1
ExecStart={python} -m sglang.launch_server \\
    --model-path /srv/models/m \\
    --port 30004
Restart=on-failure
"""


@pytest.mark.parametrize(
    "python",
    ["/opt/sglang/releases/test-minimal-3c9f/bin/python", "/opt/my venv/bin/python", "/opt/50%/$x/bin/py\"thon"],
)
def test_exec_python_reads_what_the_role_wrote(python):
    unit = UNIT.format(python=SERVICE.systemd_quote(python))
    assert AB.exec_python(unit) == python


def test_exec_python_without_execstart_fails():
    with pytest.raises(AB.AnsibleFilterError, match="no ExecStart"):
        AB.exec_python("[Service]\nType=exec\nExecStart=\n")


def test_flag_value():
    argv = ["--model-path", "/srv/models/m", "--enable-cache-report", "--speculative-draft-model-path=/d", "--x"]
    assert AB.flag_value(argv, "--model-path") == "/srv/models/m"
    assert AB.flag_value(argv, "--speculative-draft-model-path") == "/d"
    assert AB.flag_value(argv, "--enable-cache-report") == ""
    assert AB.flag_value(argv, "--x") == ""
    assert AB.flag_value(argv, "--absent") == ""
