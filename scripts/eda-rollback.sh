#!/usr/bin/env bash
# Starts the event-driven rollback (docs/event-driven.md): ansible-rulebook from .cache/eda-venv
# (`make eda`) on extensions/eda/rulebooks/rollback_validated.yml, in the checkout's root (the
# rulebook names playbooks/rollback_validated.yml relative to it: give -i and -e paths absolute or
# relative to the checkout). Off by default: nothing starts this but an operator.
#   scripts/eda-rollback.sh -i inventories/<fleet> -e /etc/hicache-fleet/eda-vars.yml
# Every argument goes to ansible-rulebook. The playbook runs with the controller's ansible-playbook
# (.venv/bin, or CONTROLLER_BIN) and the checkout's ansible.cfg (or ANSIBLE_CONFIG).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
eda="${EDA_VENV:-$root/.cache/eda-venv}"
controller="${CONTROLLER_BIN:-$root/.venv/bin}"
if [[ ! -x "$eda/bin/ansible-rulebook" ]]; then
  echo "eda-rollback: $eda/bin/ansible-rulebook is missing: run make eda" >&2
  exit 2
fi
if [[ ! -x "$controller/ansible-playbook" ]]; then
  echo "eda-rollback: $controller/ansible-playbook is missing: run make setup (or set CONTROLLER_BIN)" >&2
  exit 2
fi
export PATH="$eda/bin:$controller:$PATH"
export ANSIBLE_CONFIG="${ANSIBLE_CONFIG:-$root/ansible.cfg}"
# ansible-runner (run_playbook) sets ANSIBLE_CALLBACK_PLUGINS to its own directory, which hides
# ansible.cfg's callback_plugins: keep the toolkit's (rollout_outcome finishes the report and
# releases the controller's lock of a run that stops early) in front of it.
export ANSIBLE_CALLBACK_PLUGINS="$root/callback_plugins${ANSIBLE_CALLBACK_PLUGINS:+:$ANSIBLE_CALLBACK_PLUGINS}"
# run_playbook copies the playbook alone into a private directory: its filters
# (playbooks/filter_plugins) are found here instead.
export ANSIBLE_FILTER_PLUGINS="$root/playbooks/filter_plugins${ANSIBLE_FILTER_PLUGINS:+:$ANSIBLE_FILTER_PLUGINS}"
cd "$root"
exec ansible-rulebook -r extensions/eda/rulebooks/rollback_validated.yml "$@"
