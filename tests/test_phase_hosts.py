"""playbooks/filter_plugins/phase_hosts.py: the host pattern of each phase play, against the inline
Jinja it replaced in playbooks/preflight.yml, rocm.yml, venv.yml and models.yml."""

from __future__ import annotations

import pytest
from jinja_old import expr
from plugins import load

F = load("playbooks/filter_plugins/phase_hosts.py")

OLD_PREFLIGHT = "'sglang_hosts' ~ (':!_converged' if '_converged' in groups else '')"
OLD_PHASE = ("'sglang_hosts' ~ (':!_converged' if '_converged' in groups else '')"
             " ~ (':!_current_{phase}' if '_current_{phase}' in groups else '')")


@pytest.mark.parametrize("groups", [
    {"all": [], "sglang_hosts": ["a"]},
    {"sglang_hosts": ["a"], "_converged": ["a"]},
    {"sglang_hosts": ["a"], "_current_rocm": ["a"], "_current_venv": ["a"], "_current_models": ["a"]},
    {"sglang_hosts": ["a"], "_converged": ["a"], "_current_rocm": ["a"], "_current_models": ["a"]},
])
@pytest.mark.parametrize("phase", ["rocm", "venv", "models"])
def test_phase_hosts(groups, phase):
    assert F.phase_hosts(groups, ["_converged"]) == expr(OLD_PREFLIGHT, groups=groups)
    old = expr(OLD_PHASE.format(phase=phase), groups=groups)
    assert F.phase_hosts(groups, ["_converged", f"_current_{phase}"]) == old
