"""Mitogen's ``mitogen_linear`` strategy, found through ansible.cfg's ``strategy_plugins``.

The toolkit's optional faster controller (README, "Mitogen"): with the pinned ``mitogen`` package
installed (requirements/controller.txt), ``ANSIBLE_STRATEGY=mitogen_linear`` is the one setting that
turns it on; without it, Ansible's own ``linear`` strategy runs. This file only names Mitogen's
strategy where Ansible looks for it, so that nobody has to point ANSIBLE_STRATEGY_PLUGINS into a
virtualenv's site-packages; the strategy itself is Mitogen's.

One change to Mitogen's behaviour: its CPU affinity policy is off unless
``HICACHE_FLEET_MITOGEN_AFFINITY=1``. Mitogen's ``FixedPolicy`` (ansible_mitogen/affinity.py) reserves
CPU 0 for its multiplexer on a machine with 2 or 3 CPUs and pins the controller, every worker and
every subprocess they start (ssh, a local ``command``, a nested ansible-playbook, and whatever those
start in turn) to the remaining CPU. On the 2-core CI machine that left one core idle while three
molecule lanes queued on the other (vmstat: 47 % idle with 5 to 13 runnable; /proc/stat: cpu0 idle,
cpu1 busy; docs/testing.md, "Budget"). Without a policy the kernel schedules them on every CPU.
"""

from __future__ import annotations

import os

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
    import ansible_mitogen.affinity
    import ansible_mitogen.loaders
    import ansible_mitogen.strategy
except ImportError as exc:  # pragma: no cover - only without the pinned controller venv
    raise AnsibleError(
        "ANSIBLE_STRATEGY=mitogen_linear needs Mitogen, which is not importable by this "
        f"ansible-playbook ({exc}). Install the controller's pinned tool set (make setup, or "
        "pip install -r requirements/controller.txt), or unset ANSIBLE_STRATEGY to run the "
        "plain linear strategy."
    ) from exc

if os.environ.get("HICACHE_FLEET_MITOGEN_AFFINITY", "") != "1":
    # The base Policy assigns nothing: no process is pinned, and mitogen.parent's pre-exec hook (set
    # only when a policy pins a process) stays unset. Read at call time by ansible_mitogen.process
    # and .strategy (``ansible_mitogen.affinity.policy.assign_*()``), so replacing it here, before
    # the strategy runs, is enough.
    ansible_mitogen.affinity.policy = ansible_mitogen.affinity.Policy()

_Linear = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, _Linear):
    """Ansible's linear strategy run through Mitogen's connection and action wrappers."""
