#!/usr/bin/env bash
# `make molecule`: every molecule scenario, in two lanes that run side by side (the scenarios are
# independent: each has its own test hosts, addresses and state). What the scenarios share on the
# controller (the base rootfs, the SSH key, the wheelhouse and fixture models, the router's venv) is
# built first, once, so the lanes never build it at the same time. Each scenario's output goes to
# .cache/logs/molecule-<scenario>.log; a failed scenario's log tail is printed, and its lane stops.
#   molecule-lanes.sh SCENARIO...     (default lane split: rollout alone, everything else in turn)
set -uo pipefail
cd "$(dirname "$0")/.."
bin="$PWD/.venv/bin"
export PATH="$bin:$PATH" ANSIBLE_CONFIG="$PWD/ansible.cfg"
cache="${HICACHE_FLEET_CACHE:-$PWD/.cache}"
logs="$cache/logs"
mkdir -p "$logs"
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || { echo "usage: $0 SCENARIO..." >&2; exit 2; }

stamp() { date +%s; }
t0=$(stamp)
echo "== shared controller state (base rootfs, SSH key, wheelhouse, fixture models, router venv)"
./molecule/resources/hosts.sh base || exit 1
./molecule/resources/hosts.sh key >/dev/null || exit 1
ansible-playbook playbooks/demo_prepare.yml >"$logs/demo_prepare.log" 2>&1 || { tail -n 40 "$logs/demo_prepare.log"; exit 1; }
if [ ! -x "$cache/sglang-router-venv/bin/python" ]; then
  "$bin/python" -m venv "$cache/sglang-router-venv" && "$cache/sglang-router-venv/bin/pip" install --quiet -r requirements/router.txt || exit 1
fi
echo "   ready after $(( $(stamp) - t0 )) s"

lane_a=() lane_b=()
for s in "${scenarios[@]}"; do
  if [ "$s" = rollout ]; then lane_a+=("$s"); else lane_b+=("$s"); fi
done

run_lane() {  # name scenario...
  local lane=$1; shift
  local s start rc
  for s in "$@"; do
    start=$(stamp)
    molecule test -s "$s" >"$logs/molecule-$s.log" 2>&1
    rc=$?
    echo "$s $rc $(( $(stamp) - start ))" >>"$logs/lanes.status"
    echo "== lane $lane: molecule scenario $s: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $(( $(stamp) - start )) s"
    [ $rc -eq 0 ] || return 1
  done
}

: >"$logs/lanes.status"
pids=()
if [ ${#lane_a[@]} -gt 0 ]; then run_lane A "${lane_a[@]}" & pids+=($!); fi
if [ ${#lane_b[@]} -gt 0 ]; then run_lane B "${lane_b[@]}" & pids+=($!); fi
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done

echo "== molecule: $(( $(stamp) - t0 )) s in all"
while read -r s rc secs; do
  printf '   %-14s %-7s %5s s\n' "$s" "$([ "$rc" -eq 0 ] && echo passed || echo FAILED)" "$secs"
  if [ "$rc" -ne 0 ]; then
    echo "---- last 60 lines of $logs/molecule-$s.log"
    tail -n 60 "$logs/molecule-$s.log"
  fi
done <"$logs/lanes.status"
for s in "${scenarios[@]}"; do
  grep -q "^$s " "$logs/lanes.status" || { echo "   $s not run (its lane stopped earlier)"; status=1; }
done
exit $status
