#!/usr/bin/env bash
# `make test`: everything CI runs, each stage timed (docs/testing.md, "How CI is scheduled").
#   scripts/test.sh SCENARIO...
# Three things overlap on the two cores:
#   - the checks (lint, syntax, then pytest less the tests marked shared_state), one after another,
#     in the background; each one's output goes to .cache/logs/check-<stage>.log, printed whole
#     when it fails;
#   - the molecule stage's shared state and host image (`molecule-lanes.sh --prepare`), from the start;
#   - the molecule lanes (the scenarios given, and pytest-shared-state), as soon as that is ready,
#     beside whatever checks are still running.
# A failed check stops the lanes from starting another scenario (MOLECULE_STOP_FILE); the running
# ones finish. The exit status is 0 only when every check and every scenario passed.
set -uo pipefail
cd "$(dirname "$0")/.."
make=${MAKE:-make}
logs="${HICACHE_FLEET_CACHE:-$PWD/.cache}/logs"
mkdir -p "$logs"
stop_file="$logs/test.stop"
rm -f "$stop_file"
start=$(date +%s)
since() { echo $(($(date +%s) - $1)); }

(
  for t in lint syntax pytest; do
    s=$(date +%s)
    if ! "$make" --no-print-directory "$t" PYTEST_MARK='not shared_state' >"$logs/check-$t.log" 2>&1; then
      echo "==== $logs/check-$t.log"
      cat "$logs/check-$t.log"
      echo "make test: $t FAILED after $(since "$s") s; no lane starts another scenario"
      touch "$stop_file"
      exit 1
    fi
    echo "make test: $t took $(since "$s") s (done $(since "$start") s after the start)"
  done
) &
checks=$!

status=0
if ./scripts/molecule-lanes.sh --prepare "$@" >"$logs/molecule-prepare.log" 2>&1; then
  echo "make test: molecule's shared state ready $(since "$start") s after the start"
  if [ -e "$stop_file" ]; then
    echo "make test: molecule not started (a check failed)"
    status=1
  else
    s=$(date +%s)
    MOLECULE_STOP_FILE=$stop_file ./scripts/molecule-lanes.sh "$@" pytest-shared-state || status=1
    echo "make test: molecule (and the pytest tests that need its shared state) took $(since "$s") s"
  fi
else
  cat "$logs/molecule-prepare.log"
  echo "make test: molecule's shared state FAILED"
  status=1
fi
wait "$checks" || status=1
if [ "$status" -eq 0 ]; then
  echo "make test: all checks passed in $(since "$start") s"
else
  echo "make test: FAILED after $(since "$start") s"
fi
exit "$status"
