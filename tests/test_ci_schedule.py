"""scripts/test.sh (`make test`, what CI runs): the checks beside the molecule lanes. Run on a copy of the
script with a stand-in `make` (MAKE) and a stand-in scripts/molecule-lanes.sh that record what they were
asked to do; nothing real is built or booted."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE_MAKE = """#!/usr/bin/env bash
# stand-in make: records the stage; FAIL_STAGE fails it
stage=$2
echo "$stage $3" >>"$RECORD/make"
echo "output of $stage"
[ "$stage" != "${FAIL_STAGE:-}" ] || { echo "the $stage error"; exit 1; }
"""

FAKE_LANES = """#!/usr/bin/env bash
# stand-in molecule-lanes.sh: --prepare fails with PREPARE_FAIL; the lanes wait (bounded) for the checks
# to finish or for the stop file, then record what they saw
if [ "$1" = --prepare ]; then
  shift; echo "prepare $*" >>"$RECORD/lanes"; echo "prepare output"
  [ -z "${PREPARE_FAIL:-}" ] || { echo "the prepare error"; exit 1; }
  exit 0
fi
echo "lanes $* stop=${MOLECULE_STOP_FILE:-}" >>"$RECORD/lanes"
for _ in $(seq 100); do
  [ -z "${LANES_IGNORE_STOP:-}" ] && [ -e "$MOLECULE_STOP_FILE" ] && { echo "stopped" >>"$RECORD/lanes"; exit 1; }
  [ "$(grep -c . "$RECORD/make" 2>/dev/null)" = 3 ] && break
  sleep 0.05
done
echo "scenarios done" >>"$RECORD/lanes"
exit "${LANES_RC:-0}"
"""


def run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "test.sh", tree / "scripts" / "test.sh")
    (tree / "scripts" / "molecule-lanes.sh").write_text(FAKE_LANES)
    make = tmp_path / "make"
    make.write_text(FAKE_MAKE)
    for p in (make, tree / "scripts" / "molecule-lanes.sh"):
        p.chmod(0o755)
    record = tmp_path / "record"
    record.mkdir()
    full_env = {**os.environ, "MAKE": str(make), "RECORD": str(record), "HICACHE_FLEET_CACHE": str(tmp_path / "cache"),
                **env}
    result = subprocess.run(["bash", str(tree / "scripts" / "test.sh"), "rollout", "models"], env=full_env,
                            capture_output=True, text=True, timeout=60, check=False)
    return result, record


def test_everything_passes_checks_in_order_and_lanes_with_the_shared_state_tests(tmp_path):
    result, record = run(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (record / "make").read_text().splitlines() == [
        f"{stage} PYTEST_MARK=not shared_state" for stage in ("lint", "syntax", "pytest")]
    lanes = (record / "lanes").read_text().splitlines()
    assert lanes[0] == "prepare rollout models"
    assert lanes[1].startswith("lanes rollout models pytest-shared-state stop=")
    assert lanes[2] == "scenarios done"
    for stage in ("lint", "syntax", "pytest"):
        assert f"make test: {stage} took " in result.stdout
    assert "make test: molecule's shared state ready" in result.stdout
    assert "make test: all checks passed in" in result.stdout
    # A check's output is in its log, not in the summary, when it passes.
    assert "output of lint" not in result.stdout
    assert (tmp_path / "cache" / "logs" / "check-lint.log").read_text() == "output of lint\n"


def test_a_failed_check_prints_its_log_stops_the_lanes_and_fails_the_run(tmp_path):
    result, record = run(tmp_path, FAIL_STAGE="lint")
    assert result.returncode == 1
    assert "the lint error" in result.stdout
    assert "make test: lint FAILED" in result.stdout
    assert "all checks passed" not in result.stdout
    # No check after the failed one runs.
    assert (record / "make").read_text().splitlines() == ["lint PYTEST_MARK=not shared_state"]
    lanes = (record / "lanes").read_text()
    assert "scenarios done" not in lanes
    # The lanes either saw the stop file or were never started because the check failed first.
    assert "stopped" in lanes or "make test: molecule not started (a check failed)" in result.stdout


def test_a_failed_prepare_prints_its_log_starts_no_lane_and_fails_after_the_checks(tmp_path):
    result, record = run(tmp_path, PREPARE_FAIL="1")
    assert result.returncode == 1
    assert "the prepare error" in result.stdout
    assert "make test: molecule's shared state FAILED" in result.stdout
    assert "lanes " not in (record / "lanes").read_text()
    # The checks still ran to the end (their failures would be reported too).
    assert len((record / "make").read_text().splitlines()) == 3


def test_a_failed_scenario_fails_the_run(tmp_path):
    result, _ = run(tmp_path, LANES_RC="1")
    assert result.returncode == 1
    assert "make test: FAILED after" in result.stdout
    assert "all checks passed" not in result.stdout


def test_a_check_that_fails_after_every_scenario_passed_still_fails_the_run(tmp_path):
    result, record = run(tmp_path, FAIL_STAGE="pytest", LANES_IGNORE_STOP="1")
    assert "scenarios done" in (record / "lanes").read_text()
    assert result.returncode == 1
    assert "the pytest error" in result.stdout
    assert "make test: FAILED after" in result.stdout
