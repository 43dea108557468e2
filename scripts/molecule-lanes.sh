#!/usr/bin/env bash
# `make molecule`: every molecule scenario given, run by MOLECULE_LANES workers side by side (default
# 2, one per core here; the scenarios are independent: each has its own test hosts, addresses and
# state). What the scenarios share on the controller (the base rootfs, the SSH key, the wheelhouse
# and fixture models, the router's venv) is built first, once, so that no two lanes build it at the
# same time. The host image `sglang-venv` (the demo fleet's venv release installed by the
# sglang_venv role: molecule/resources/hosts.sh image) is built beside the first scenarios; a
# scenario whose platforms start from it (`image: sglang-venv` in its molecule.yml) waits for it.
# Scenarios are taken longest first (the last run's times in .cache/logs/scenario-times, else the
# table below), each by the first free lane. After a failure no lane starts another scenario.
# Each scenario's output goes to .cache/logs/molecule-<scenario>.log, each line stamped with the
# seconds since its start; the summary gives each scenario's time and its molecule steps' times,
# and a failed scenario's log tail.
#   molecule-lanes.sh SCENARIO...
#   molecule-lanes.sh --prepare SCENARIO...   only the shared state and the image they need, then
#                                               exit (`make test` runs it beside lint and pytest)
set -uo pipefail
cd "$(dirname "$0")/.."
bin="$PWD/.venv/bin"
export PATH="$bin:$PATH" ANSIBLE_CONFIG="$PWD/ansible.cfg"
cache="${HICACHE_FLEET_CACHE:-$PWD/.cache}"
logs="$cache/logs"
mkdir -p "$logs"
# Three by default on two cores: the scenarios also wait on servers, health polls and probes. (The
# 43-48 % idle once measured with two lanes was Mitogen's CPU affinity policy pinning every worker, its
# subprocesses and the test hosts started under it to one CPU; strategy_plugins/mitogen_linear.py turns
# that policy off.)
lanes=${MOLECULE_LANES:-3}
prepare_only=false
if [ "${1:-}" = --prepare ]; then prepare_only=true; shift; fi
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || { echo "usage: $0 SCENARIO..." >&2; exit 2; }
[[ $lanes =~ ^[1-9]$ ]] || { echo "MOLECULE_LANES must be 1-9, not '$lanes'" >&2; exit 2; }

# Seconds each scenario takes in a whole `make test` on a fresh clone (2 cores, three lanes, with the
# host image; Mitogen's strategy but in rollout: docs/testing.md, "Budget"). Used only to start the longest first when this checkout has no times of its own yet
# (CI's fresh clone never has): a scenario missing here counts as 900 s and would go before shorter
# ones that are really longer.
# (monitoring: 477 s measured alone with its bake side effect, not yet in a whole run.)
declare -A expected=(
  [rollout]=1450 [rollout_gate]=1250 [rollout_ops]=1000 [sglang_service]=500 [sglang_venv]=400 [ab_benchmark]=350
  [hicache_sizing]=700 [preflight]=300 [monitoring]=550 [rocm]=150 [models]=70 [first_host]=200 [rocm_amd]=60 [capture]=480 [pytest-shared-state]=90
)
times_file="$logs/scenario-times"
if [ -f "$times_file" ]; then
  while read -r s secs; do [[ $secs =~ ^[0-9]+$ ]] && expected[$s]=$secs; done <"$times_file"
fi

stamp() { date +%s; }
t0=$(stamp)
echo "== shared controller state (base rootfs, SSH key, wheelhouse, fixture models, router venv, traffic and eda venvs)"
./molecule/resources/hosts.sh base || exit 1
./molecule/resources/hosts.sh key >/dev/null || exit 1
ansible-playbook playbooks/demo_prepare.yml >"$logs/demo_prepare.log" 2>&1 || { tail -n 40 "$logs/demo_prepare.log"; exit 1; }
if [ ! -x "$cache/sglang-router-venv/bin/python" ]; then
  "$bin/python" -m venv "$cache/sglang-router-venv" && "$cache/sglang-router-venv/bin/pip" install --quiet -r requirements/router.txt || exit 1
fi
# The traffic generator's client venv (scripts/traffic.py: SGLang's bench_serving), from the demo
# wheelhouse just built; the pytest lane below (tests marked shared_state) runs it.
make --no-print-directory traffic-venv >"$logs/traffic-venv.log" 2>&1 || { tail -n 20 "$logs/traffic-venv.log"; exit 1; }
# ansible-rulebook for the event-driven rollback's tests (tests/eda, in the same pytest lane).
make --no-print-directory eda >"$logs/eda-venv.log" 2>&1 || { tail -n 20 "$logs/eda-venv.log"; exit 1; }
echo "   ready after $(( $(stamp) - t0 )) s"

needs_image() { grep -q '^ *image: sglang-venv *$' "molecule/$1/molecule.yml" 2>/dev/null; }
image_wanted=false
for s in "${scenarios[@]}"; do needs_image "$s" && image_wanted=true; done

if $prepare_only; then
  if $image_wanted; then
    ./molecule/resources/hosts.sh image sglang-venv >"$logs/image.log" 2>&1 || { tail -n 20 "$logs/image.log"; exit 1; }
    echo "   host image sglang-venv ready after $(( $(stamp) - t0 )) s"
  fi
  exit 0
fi

# The queue: scenarios longest first (unknown ones count as long: they are new and not yet measured).
queue="$logs/lanes.queue"
for s in "${scenarios[@]}"; do echo "${expected[$s]:-900} $s"; done | sort -rn | cut -d' ' -f2 >"$queue"
: >"$logs/lanes.status"
rm -f "$logs/lanes.failed" "$logs/image.done" "$logs/image.failed"

# The host image, beside the first scenarios (only when a queued scenario uses it and it is not
# already built from what goes into it now: `make test` prepares it beside the checks).
image_pid=""
if $image_wanted && ! ./molecule/resources/hosts.sh image-current sglang-venv; then
  (
    start=$(stamp)
    if ./molecule/resources/hosts.sh image sglang-venv >"$logs/image.log" 2>&1; then
      echo "== host image sglang-venv ready in $(( $(stamp) - start )) s"; touch "$logs/image.done"
    else
      echo "== host image sglang-venv FAILED (its scenarios boot from the base and install the venv):"
      tail -n 20 "$logs/image.log"; touch "$logs/image.failed"
    fi
  ) &
  image_pid=$!
fi
image_settled() { [ -z "$image_pid" ] || [ -e "$logs/image.done" ] || [ -e "$logs/image.failed" ]; }

# Take the next scenario a lane can start now: the first in the queue, or while the image is being
# built the first that does not need it; wait while only image scenarios are left. Empty: none left.
take() {
  local s pick=""
  while :; do
    exec 9>"$queue.lock"
    flock 9
    if [ ! -s "$queue" ] || [ -e "$logs/lanes.failed" ]; then flock -u 9; return 0; fi
    while read -r s; do
      if image_settled || ! needs_image "$s"; then pick=$s; break; fi
    done <"$queue"
    if [ -n "$pick" ]; then
      grep -vx -- "$pick" "$queue" >"$queue.new" || true
      mv "$queue.new" "$queue"
      flock -u 9
      echo "$pick"
      return 0
    fi
    flock -u 9
    sleep 2
  done
}

# Each line of the scenario's log stamped with its second since the scenario's start (no fork).
stamp_lines() {
  local start=$1 now line
  while IFS= read -r line; do
    printf -v now '%(%s)T' -1
    printf '%5d %s\n' $((now - start)) "$line"
  done
}

run_lane() {  # lane name
  local lane=$1 s start rc
  while :; do
    s=$(take)
    [ -n "$s" ] || return 0
    start=$(stamp)
    echo "== lane $lane: molecule scenario $s started ($(cut -d' ' -f1 /proc/loadavg) load)"
    if [ "$s" = pytest-shared-state ]; then
      # Not a scenario: the pytest tests that need this shared state (marked shared_state; make test's
      # pytest stage, which runs beside its preparation, leaves them out).
      "$bin/pytest" -m shared_state -q 2>&1 | stamp_lines "$start" >"$logs/molecule-$s.log"
    else
      molecule test -s "$s" 2>&1 | stamp_lines "$start" >"$logs/molecule-$s.log"
    fi
    rc=${PIPESTATUS[0]}
    echo "$s $rc $(( $(stamp) - start ))" >>"$logs/lanes.status"
    echo "== lane $lane: molecule scenario $s: $([ "$rc" -eq 0 ] && echo passed || echo FAILED) in $(( $(stamp) - start )) s"
    [ "$rc" -eq 0 ] || { touch "$logs/lanes.failed"; return 1; }
  done
}

pids=()
for ((i = 1; i <= lanes; i++)); do run_lane "$i" & pids+=($!); done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
[ -z "$image_pid" ] || wait "$image_pid"

# molecule's steps in a scenario's stamped log: "<secs> ... ➜ step: Executing" starts one.
step_times() {
  sed -E 's/\x1b\[[0-9;]*m//g' "$1" | awk '
    / ➜ [a-z_]+: Executing$/ { split($0, a, " ➜ "); sub(/:.*/, "", a[2]); if (step != "") out = out sprintf(" %s %ds", step, $1 - t); step = a[2]; t = $1 }
    { last = $1 }
    END { if (step != "") out = out sprintf(" %s %ds", step, last - t); print out }'
}

echo "== molecule: $(( $(stamp) - t0 )) s in all, $lanes lanes (load now $(cut -d' ' -f1-3 /proc/loadavg))"
while read -r s rc secs; do
  printf '   %-14s %-7s %5s s  steps:%s\n' "$s" "$([ "$rc" -eq 0 ] && echo passed || echo FAILED)" "$secs" "$(step_times "$logs/molecule-$s.log")"
  if [ "$rc" -eq 0 ]; then
    { grep -v "^$s " "$times_file" 2>/dev/null || true; echo "$s $secs"; } >"$times_file.new" && mv "$times_file.new" "$times_file"
  else
    echo "---- last 60 lines of $logs/molecule-$s.log"
    tail -n 60 "$logs/molecule-$s.log"
  fi
done <"$logs/lanes.status"
for s in "${scenarios[@]}"; do
  grep -q "^$s " "$logs/lanes.status" || { echo "   $s not run (a scenario failed before)"; status=1; }
done
# What failed, last, where a short tail of the output (CI's) still shows it: the verifier's failed
# tests and their first assertion lines, or the failed Ansible tasks with the first failure's message
# (its indented lines after `fatal:`, at most 12; CI once showed three bare `FAILED! =>`).
while read -r s rc secs; do
  [ "$rc" -eq 0 ] && continue
  echo "== $s failed at:"
  sed -E 's/\x1b\[[0-9;]*m//g; s/^ *[0-9]+ +//; s/^│ //' "$logs/molecule-$s.log" |
    awk '/^(TASK|RUNNING HANDLER) \[/ { task = $0; msg = 0; shown = 0; next }
      /^FAILED - RETRYING/ { next }
      /^(FAILED|E  |fatal: |tests\/.*Error$)/ {
        if (task != "") { print task; task = "" }
        print; msg = (/^fatal: / && !shown) ? 12 : 0; if (msg) shown = 1; next }
      msg > 0 && /^ / { print; msg--; next }
      { msg = 0 }' | cut -c1-300 | tail -n 40
done <"$logs/lanes.status"
exit $status
