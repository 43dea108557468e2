#!/usr/bin/env bash
# Test harness only (molecule/rocm side effect). On a production host, systemd brings a rebooted
# machine back; a test host is a systemd-nspawn guest, and when its systemd reboots, systemd-nspawn
# exits (status 133) instead (systemd-nspawn@.service restarts it through RestartForceExitStatus=133;
# hosts.sh runs nspawn without that unit). This plays that unit's part for one guest: it waits (at
# most TIMEOUT seconds) until the guest's systemd-nspawn exits, then boots the guest's kept copy again
# with `hosts.sh start`. Usage: reboot-watcher.sh HOSTS_SH NAME [TIMEOUT]
set -euo pipefail
hosts_sh=$1 name=$2 timeout=${3:-600}
cache=${HICACHE_FLEET_CACHE:-$(cd "$(dirname "$hosts_sh")/../.." && pwd)/.cache}
pid=$(cat "$cache/hosts/$name/nspawn.pid")
deadline=$((SECONDS + timeout))
while kill -0 "$pid" 2>/dev/null; do
  if [ $SECONDS -ge $deadline ]; then
    echo "reboot-watcher: $name did not reboot within ${timeout}s" >&2
    exit 1
  fi
  sleep 0.5
done
echo "reboot-watcher: $name's systemd-nspawn (pid $pid) exited for the reboot; booting it again" >&2
exec "$hosts_sh" start "$name"
