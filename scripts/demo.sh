#!/usr/bin/env bash
# `make demo`: boot the local demo fleet (three real systemd test hosts on 127.0.30.1-3), prepare
# what a production fleet would fetch from its registries (an offline wheelhouse, small fixture
# models), then run the real site.yml on it. The GPU servers are played by the SGLang-API
# SIMULATOR (sim/): no machine here has a Radeon GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
bin="$PWD/.venv/bin"
hosts_sh=molecule/resources/hosts.sh
cache="${HICACHE_FLEET_CACHE:-$PWD/.cache}"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "1/4 Boot the demo fleet: three Debian guests with systemd as PID 1 (systemd-nspawn), one loopback address each"
for i in 1 2 3; do "$hosts_sh" up "demo-$i" "127.0.30.$i"; done

say "2/4 Prepare the controller: an offline wheelhouse (real sglang==0.5.23 + CPU torch + the simulator) and fixture models"
"$bin/ansible-playbook" playbooks/demo_prepare.yml

say "3/4 Run site.yml on the demo fleet: preflight, ROCm, venv, models, then the gated rollout"
cat <<'TXT'
   Each host gets a hardened systemd unit with the field report's validated HiCache launch command.
   Before the rollout moves on from a host, a probe reads 64K/32K random tokens cold (cache flushed),
   pushes them out of GPU memory, and reads them again: HiCache must serve them from host RAM, fast.
   The "GPU server" on these hosts is the SGLang-API SIMULATOR, not SGLang (time scaled x0.01).
TXT
"$bin/ansible-playbook" -i inventories/demo site.yml "$@"

say "4/4 The rollout report"
run_dir=$(ls -d inventories/demo/reports/rollout/*/ | sort | tail -n 1)
cat "$run_dir/rollout.md"
echo
echo "chart: ${run_dir}ttft.png"
echo "The demo hosts keep running (ssh -i $cache/ssh/id_ed25519 root@127.0.30.1); stop them with: make demo-down"
