#!/usr/bin/env bash
# `make test`: everything CI runs, each stage timed (docs/testing.md, "How CI is scheduled").
#   scripts/test.sh SCENARIO...
# On the two cores:
#   1. pytest (less the tests marked shared_state) runs beside `molecule-lanes.sh --prepare`, the
#      molecule stage's shared state and host image (mostly downloads and installs);
#   2. when both passed, the molecule lanes (the scenarios given, and pytest-shared-state) start, and
#      lint and syntax run beside them at the lowest CPU priority (nice 19): they take the cycles the
#      lanes leave idle and do not slow the lanes' servers, whose probes measure time. (Run beside the
#      lanes at normal priority, pytest once tripled its time and a scenario's TTFT gate failed on noise.)
# Each check's output goes to .cache/logs/check-<stage>.log, printed whole when it fails. A failed
# lint or syntax stops the lanes from starting another scenario (MOLECULE_STOP_FILE); the running
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

# check STAGE...: each stage in turn through make, its output in its log; the first failure is printed
# whole, writes the stop file and ends the list with status 1.
check() {
  local t s
  for t in "$@"; do
    s=$(date +%s)
    if ! "$make" --no-print-directory "$t" PYTEST_MARK='not shared_state' >"$logs/check-$t.log" 2>&1; then
      echo "==== $logs/check-$t.log"
      cat "$logs/check-$t.log"
      echo "make test: $t FAILED after $(since "$s") s"
      touch "$stop_file"
      return 1
    fi
    echo "make test: $t took $(since "$s") s (done $(since "$start") s after the start)"
  done
}

status=0
check pytest &
pytest_pid=$!
prepared=true
if ./scripts/molecule-lanes.sh --prepare "$@" >"$logs/molecule-prepare.log" 2>&1; then
  echo "make test: molecule's shared state ready $(since "$start") s after the start"
else
  cat "$logs/molecule-prepare.log"
  echo "make test: molecule's shared state FAILED"
  prepared=false
fi
wait "$pytest_pid" || status=1

if $prepared && [ "$status" -eq 0 ]; then
  nice -n 19 bash -c "$(declare -f check since); $(declare -p make logs stop_file start); check lint syntax" &
  checks=$!
  s=$(date +%s)
  MOLECULE_STOP_FILE=$stop_file ./scripts/molecule-lanes.sh "$@" pytest-shared-state || status=1
  echo "make test: molecule (and the pytest tests that need its shared state) took $(since "$s") s"
  wait "$checks" || status=1
else
  echo "make test: molecule not started (a check or the shared state failed); lint and syntax still run"
  check lint syntax
  status=1
fi
if [ "$status" -eq 0 ]; then
  echo "make test: all checks passed in $(since "$start") s"
else
  echo "make test: FAILED after $(since "$start") s"
fi
exit "$status"
