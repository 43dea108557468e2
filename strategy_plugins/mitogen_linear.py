"""Mitogen's ``mitogen_linear`` strategy, found through ansible.cfg's ``strategy_plugins``.

The toolkit's optional faster controller (README, "Mitogen"): with the pinned ``mitogen`` package
installed (requirements/controller.txt), ``ANSIBLE_STRATEGY=mitogen_linear`` is the one setting that
turns it on; without it, Ansible's own ``linear`` strategy runs. This file only names Mitogen's
strategy where Ansible looks for it, so that nobody has to point ANSIBLE_STRATEGY_PLUGINS into a
virtualenv's site-packages; the strategy itself is Mitogen's.
"""

from __future__ import annotations

from ansible.errors import AnsibleError

DOCUMENTATION = """
name: mitogen_linear
short_description: Mitogen's linear strategy (the pinned mitogen package)
description:
  - Ansible's linear strategy, with Mitogen running each host's modules in one persistent Python
    interpreter instead of one SSH round trip and upload per task.
  - Needs the mitogen package pinned in requirements/controller.txt (make setup installs it).
author: hicache-fleet
"""

try:
    import ansible_mitogen.loaders
    import ansible_mitogen.strategy
except ImportError as exc:  # pragma: no cover - only without the pinned controller venv
    raise AnsibleError(
        "ANSIBLE_STRATEGY=mitogen_linear needs Mitogen, which is not importable by this "
        f"ansible-playbook ({exc}). Install the controller's pinned tool set (make setup, or "
        "pip install -r requirements/controller.txt), or unset ANSIBLE_STRATEGY to run the "
        "plain linear strategy."
    ) from exc

_Linear = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, _Linear):
    """Ansible's linear strategy run through Mitogen's connection and action wrappers."""
