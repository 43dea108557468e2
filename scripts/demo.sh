#!/usr/bin/env bash
# `make demo`: boot the local demo fleet (real systemd test hosts: the three of inventories/demo on
# 127.0.30.1-3, or demo-1..N on 127.0.30.1-N with DEMO_HOSTS=N, N from 1 to 40), prepare what a
# production fleet would fetch from its registries (an offline wheelhouse, small fixture models),
# then run the real site.yml on it. The GPU servers are played by the SGLang-API SIMULATOR (sim/):
# no machine here has a Radeon GPU.
#   scripts/demo.sh [ANSIBLE-PLAYBOOK ARGS]   the demo (DEMO_HOSTS=N: a fleet of N, default 3)
#   scripts/demo.sh --down                    `make demo-down`: stop every demo host this checkout
#                                             runs (demo-1..40), remove the extra hosts' inventory
# Hosts beyond the three boot from the host image sglang-venv (the venv installed once; built here
# when it is not current) and get their inventory from scripts/demo_inventory.py, written to
# .cache/demo/hosts-extra.yml and passed as a second -i after inventories/demo.
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
bin="$PWD/.venv/bin"
hosts_sh=molecule/resources/hosts.sh
cache="${HICACHE_FLEET_CACHE:-$PWD/.cache}"
extra_inventory="$cache/demo/hosts-extra.yml"
image=sglang-venv
max_hosts=40

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() { printf 'demo: ERROR: %s\n' "$*" >&2; exit 2; }

# The demo hosts this checkout has (running or stopped), whatever fleet size they were booted for.
demo_hosts() { "$hosts_sh" list | awk -F'\t' '$1 ~ /^demo-[0-9]+$/ {print $1}'; }

# Stop the demo hosts numbered above $1 (0: every one) and remove their copies.
down_above() {
  local name
  for name in $(demo_hosts); do
    if [ "${name#demo-}" -gt "$1" ]; then "$hosts_sh" down "$name"; fi
  done
}

# The running hosts whose root is an overlay of host image $image (it must not be rebuilt under them).
image_users() {
  local name
  "$hosts_sh" list | awk -F'\t' '$3 == "running" {print $1}' | while read -r name; do
    if [ "$(cat "$cache/hosts/$name/lower" 2>/dev/null)" = "$cache/images/$image" ]; then printf '%s ' "$name"; fi
  done
}

if [ "${1:-}" = --down ]; then
  down_above 0
  rm -f "$extra_inventory"
  exit 0
fi

# Checked before anything is booted or built.
n=${DEMO_HOSTS:-3}
if ! [[ $n =~ ^[1-9][0-9]?$ ]] || [ "$n" -gt "$max_hosts" ]; then
  die "DEMO_HOSTS must be an integer from 1 to $max_hosts (got '$n'); nothing was booted"
fi
static=$((n < 3 ? n : 3))

if [ "$n" -eq 3 ]; then
  say "1/4 Boot the demo fleet: three Debian guests with systemd as PID 1 (systemd-nspawn), one loopback address each"
else
  say "1/4 Boot the demo fleet of $n (DEMO_HOSTS): Debian guests with systemd as PID 1 (systemd-nspawn), one loopback address each"
fi
# A fleet of N is demo-1..N: demo hosts left from a larger fleet are stopped.
down_above "$n"
for i in $(seq 1 "$static"); do "$hosts_sh" up "demo-$i" "127.0.30.$i"; done

say "2/4 Prepare the controller: an offline wheelhouse (real sglang==0.5.23 + CPU torch + the simulator) and fixture models"
"$bin/ansible-playbook" playbooks/demo_prepare.yml

inventory=(-i inventories/demo)
limit=()
if [ "$n" -gt 3 ]; then
  say "2/4 The hosts beyond the inventory's three: demo-4..demo-$n on 127.0.30.4-$n, from the host image $image"
  if PATH="$bin:$PATH" "$hosts_sh" image-current "$image"; then
    echo "   host image $image is current"
  else
    users=$(image_users)
    if [ -n "$users" ]; then
      # hosts.sh: never rebuild an image while hosts booted from it run (their overlays read it).
      echo "   host image $image is not current but ${users}run from it: not rebuilt; the extra hosts boot"
      echo "   from it as it is and site.yml's venv phase installs what differs"
    else
      PATH="$bin:$PATH" "$hosts_sh" image "$image"
    fi
  fi
  for i in $(seq 4 "$n"); do "$hosts_sh" up "demo-$i" "127.0.30.$i" 22 "$image"; done
  "$bin/python" scripts/demo_inventory.py "$n" "$extra_inventory" >/dev/null
  echo "   their inventory: $extra_inventory (generated; passed after -i inventories/demo)"
  inventory+=(-i "$extra_inventory")
else
  rm -f "$extra_inventory"
  if [ "$n" -lt 3 ]; then limit=(--limit "$(seq -f 'demo-%g' -s, 1 "$n")"); fi
fi

# The controller's fact cache (ansible.cfg: .cache/facts, a day) may hold facts of an earlier demo
# host of the same name, or of whatever answered on its address: a booted guest is a new machine.
for i in $(seq 1 "$n"); do rm -f .cache/facts/*"demo-$i"; done

say "3/4 Run site.yml on the demo fleet: preflight, ROCm, venv, models, then the gated rollout"
cat <<'TXT'
   Each host gets a hardened systemd unit with the field report's validated HiCache launch command.
   Before the rollout moves on from a host, a probe reads 64K/32K random tokens cold (cache flushed),
   pushes them out of GPU memory, and reads them again: HiCache must serve them from host RAM, fast.
   The "GPU server" on these hosts is the SGLang-API SIMULATOR, not SGLang (time scaled x0.01).
TXT
"$bin/ansible-playbook" "${inventory[@]}" site.yml "${limit[@]}" "$@"

say "4/4 The rollout report"
run_dir=$(ls -d inventories/demo/reports/rollout/*/ | sort | tail -n 1)
cat "$run_dir/rollout.md"
echo
echo "chart: ${run_dir}ttft.png"
echo "The demo hosts keep running (ssh -i $cache/ssh/id_ed25519 root@127.0.30.1); stop them with: make demo-down"
