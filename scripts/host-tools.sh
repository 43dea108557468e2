#!/usr/bin/env bash
# Installs the machine tools the test hosts need (debootstrap, systemd-nspawn, ssh client) when they
# are missing, through the system's package manager. Called by `make setup`; a no-op when present.
set -euo pipefail
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
command -v ssh >/dev/null || missing+=(openssh-client)
# promtool checks and unit-tests roles/monitoring's rules (tests/monitoring); Debian ships it in prometheus.
command -v promtool >/dev/null || missing+=(prometheus)
# ansible-rulebook (make eda, tests/eda: the event-driven rollback's rulebook) runs on Java 17.
command -v java >/dev/null || [ -n "${JAVA_HOME:-}" ] || missing+=(openjdk-17-jre-headless)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "host-tools: missing ${missing[*]}; install them (Debian/Ubuntu: apt-get install ${missing[*]}) and re-run" >&2
  exit 1
fi
echo "host-tools: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The controller needs promtool only: do not leave the package's Prometheus server running here.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
