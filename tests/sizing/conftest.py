"""Fixtures of the sizing tests: module_utils importable as Ansible names them (ansible.module_utils.*)."""

from __future__ import annotations

from pathlib import Path

import ansible.module_utils

REPO = Path(__file__).resolve().parents[2]

if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))
