"""Issue 24: SGLang logs its ServerArgs at start, api_key='...' included. With systemd 253 or later
the unit of an instance with keys has LogFilterPatterns= dropping such lines from the journal
(sglang_service_journal_key_filter: auto); on systemd 252 (Debian bookworm) it has none, since 252
refuses the directive. Rendered through the role's plan on localhost (service_render.run_plans)."""

from __future__ import annotations

import re
import subprocess

import pytest
from service_render import run_plans

FILTER = "LogFilterPatterns=~api_key=[^N]"
INSTANCES = [{"name": "keyed", "port": 30004}, {"name": "open", "port": 30005, "api_key": ""}]
CASES = {
    "v253": {"_sglang_service_systemd_version": 253},
    "v252": {"_sglang_service_systemd_version": 252},
    "forced": {"_sglang_service_systemd_version": 252, "sglang_service_journal_key_filter": "true"},
    "off": {"_sglang_service_systemd_version": 257, "sglang_service_journal_key_filter": "false"},
}


@pytest.fixture(scope="module")
def units(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("journal")
    cases = {}
    for name, extra in CASES.items():
        out = work / name
        out.mkdir()
        cases[name] = (out, {"sglang_service_api_key": "k-journal-7Yq", "sglang_service_instances": INSTANCES,
                             "sglang_service_state_dir": str(work / "state"), **extra})
    run_plans(work, cases)
    return {name: {inst: (work / name / f"sglang-{inst}.service").read_text() for inst in ("keyed", "open")}
            for name in CASES}


def test_the_filter_is_rendered_for_a_keyed_instance_on_systemd_253_or_when_asked(units):
    assert FILTER in units["v253"]["keyed"].splitlines()
    assert FILTER in units["forced"]["keyed"].splitlines()
    for case in ("v252", "off"):
        assert "LogFilterPatterns" not in units[case]["keyed"], case
    # An instance without keys has nothing to hide.
    for case in CASES:
        assert "LogFilterPatterns" not in units[case]["open"], case


@pytest.mark.parametrize(
    ("line", "dropped"),
    [
        ("server_args=ServerArgs(model_path='/srv/m', api_key='k-journal-7Yq', port=30004)", True),
        ("server_args=ServerArgs(model_path='/srv/m', api_key=None, admin_api_key='adm-1')", True),
        ("server_args=ServerArgs(model_path='/srv/m', api_key=None, admin_api_key=None)", False),
        ("Load weight end. type=Qwen3ForCausalLM", False),
    ],
)
def test_the_pattern_drops_the_lines_with_a_key_and_keeps_the_rest(line, dropped):
    """The pattern as journald applies it (PCRE2, a match anywhere in the message drops it with ~)."""
    pattern = FILTER.split("=~", 1)[1]
    assert bool(re.search(pattern, line)) is dropped


def test_the_hosts_systemd_version_is_read_when_auto(tmp_path):
    """auto without a known version: the plan reads `systemctl --version` (0 when unreadable)."""
    try:
        first = subprocess.run(["systemctl", "--version"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        pytest.skip("no systemctl on this machine")
    version = int(re.match(r"systemd (\d+)", first).group(1))
    out = tmp_path / "auto"
    out.mkdir()
    run_plans(tmp_path, {"auto": (out, {"sglang_service_api_key": "k-journal-7Yq",
                                        "sglang_service_instances": INSTANCES[:1],
                                        "sglang_service_state_dir": str(tmp_path / "state")})})
    unit = (out / "sglang-keyed.service").read_text()
    assert (FILTER in unit) is (version >= 253)
