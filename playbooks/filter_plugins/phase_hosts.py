"""Filter of the phase playbooks (playbooks/preflight.yml, rocm.yml, venv.yml, models.yml): which
hosts a phase's play runs on.

- ``phase_hosts(groups, skip)``: the host pattern ``sglang_hosts`` without the hosts of each group of
  `skip` that exists (``sglang_hosts:!_converged:!_current_rocm``). playbooks/converged.yml adds
  ``_converged`` (hosts whose recorded release still matches) and ``_current_<phase>`` (hosts whose
  record holds the phase's fingerprint) only when some host is in them; a pattern naming a group
  that does not exist would warn, so only the existing ones are named.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

ALL = "sglang_hosts"


def phase_hosts(groups: Container[str], skip: Sequence[str]) -> str:
    """``sglang_hosts`` followed by ``:!<group>`` for each group of `skip` that is in `groups`, in order."""
    return ALL + "".join(f":!{group}" for group in skip if group in groups)


class FilterModule:
    """Jinja filters of the phase playbooks."""

    def filters(self) -> dict[str, Any]:
        return {"phase_hosts": phase_hosts}
