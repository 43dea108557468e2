"""Release directories for the sizing unit tests, as the sglang_service role's stage writes them (a module
of its own, so that test files import it by a unique name, whatever other conftest.py a run has loaded)."""

from __future__ import annotations

from pathlib import Path

from plugins import load

FILTERS = load("roles/sglang_service/filter_plugins/sglang_service.py", "sglang_service_filters_sizing_unit")
PYTHON = "/opt/sglang/current/bin/python"


def make_release(plan: dict, name: str, where: Path) -> Path:
    """A release directory as the role's stage writes it (unit, argv.json, release.json, env)."""
    (staged,) = FILTERS.release_instances([plan[name]], PYTHON)
    where.mkdir(parents=True, exist_ok=True)
    (where / "unit").write_text(staged["unit"])
    (where / "argv.json").write_text(staged["argv_json"])
    (where / "release.json").write_text(staged["release_json"])
    (where / "env").write_text("")
    return where
