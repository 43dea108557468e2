#!/usr/bin/env bash
# Real systemd test hosts for molecule and the demo: Debian guests booted with systemd as PID 1
# by `systemd-nspawn -b`, each a copy of one cached debootstrapped base rootfs, each reached over
# SSH on its own loopback address (127.0.0.0/8) because the guests share this machine's network.
#
#   hosts.sh base                      build the cached base rootfs once (debootstrap, ~1 min)
#   hosts.sh up NAME ADDRESS [PORT] [IMAGE]
#                                      copy the base (or host image IMAGE, once built), set sshd to
#                                      ADDRESS:PORT, boot, wait for SSH
#   hosts.sh image sglang-venv         build host image IMAGE when what goes into it changed: the base
#                                      plus the demo fleet's SGLang venv release, installed by
#                                      playbooks/venv.yml (the sglang_venv role), `current` unset
#   hosts.sh image-current sglang-venv exit 0 if image IMAGE is built from what goes into it now
#                                      (`image` would keep it), 1 if not
#   hosts.sh down NAME                 stop the guest by PID and remove its copy (safe to repeat)
#   hosts.sh stop NAME                 stop the guest by PID, keep its copy (a host gone unreachable)
#   hosts.sh start NAME                boot a stopped guest's kept copy again, wait for SSH
#   hosts.sh list                      guests this checkout has running
#   hosts.sh destroy-all               `down` for every guest this checkout knows of
#   hosts.sh key                       print the path of the SSH private key the hosts accept
#   hosts.sh stop-pid FILE             stop a controller process a scenario recorded as "PID WORD"
#
# State lives under $HICACHE_FLEET_CACHE (default: <checkout>/.cache): rootfs/<suite>, images/IMAGE,
# hosts/NAME (root/, nspawn.pid, console.log), ssh/id_ed25519.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${HICACHE_FLEET_CACHE:-$(cd "$here/../.." && pwd)/.cache}
suite=${HICACHE_FLEET_SUITE:-bookworm}
base="$cache/rootfs/$suite"
hosts="$cache/hosts"
images="$cache/images"
checkout=$(cd "$here/../.." && pwd)
# The host that builds an image, on an address of its own (127.0.23.0/24: the CI tooling's block).
image_builder=hicache-image
image_builder_address=${HICACHE_FLEET_IMAGE_ADDRESS:-127.0.23.1}
key="$cache/ssh/id_ed25519"
boot_timeout=${HICACHE_FLEET_BOOT_TIMEOUT:-90}
# python3-apt: Ansible's apt module needs it for an honest --check (Ubuntu servers ship it).
base_packages=systemd,systemd-sysv,dbus,python3,python3-apt,openssh-server,iproute2,ca-certificates,procps

log() { printf '[test-hosts] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need() {
  local missing=()
  for tool in "$@"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: apt-get install debootstrap systemd-container openssh-client"
  [ "$(id -u)" -eq 0 ] || die "test hosts need root (debootstrap and systemd-nspawn)"
}

ensure_key() {
  if [ ! -f "$key" ]; then
    mkdir -p "$(dirname "$key")"
    chmod 0700 "$(dirname "$key")"
    ssh-keygen -q -t ed25519 -N '' -C hicache-fleet-test-hosts -f "$key"
  fi
}

cmd_base() {
  need debootstrap
  if [ -x "$base/usr/bin/python3" ] && [ "$(cat "$base/.hicache-fleet-base" 2>/dev/null)" = "$base_packages" ]; then
    log "base rootfs cached: $base"
    return
  fi
  local tmp="$base.tmp.$$"
  mkdir -p "$(dirname "$base")"
  rm -rf "$tmp"
  log "building the $suite base rootfs once (debootstrap minbase)"
  trap 'rm -rf "$tmp"' EXIT
  debootstrap --variant=minbase --include="$base_packages" "$suite" "$tmp" >"$cache/rootfs/debootstrap.log" 2>&1 ||
    die "debootstrap failed; see $cache/rootfs/debootstrap.log"
  # Host keys are made per guest at boot; the base carries none.
  rm -f "$tmp"/etc/ssh/ssh_host_*
  rm -f "$tmp/etc/machine-id"
  apt_clean "$tmp"
  echo "$base_packages" >"$tmp/.hicache-fleet-base"
  rm -rf "$base"
  mv "$tmp" "$base"
  trap - EXIT
  log "base rootfs ready: $base ($(du -sh "$base" | cut -f1))"
}

apt_clean() { rm -rf "$1"/var/cache/apt/archives/*.deb; }

pid_of() { cat "$hosts/$1/nspawn.pid" 2>/dev/null || true; }
alive() { local pid; pid=$(pid_of "$1"); [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }

# The guest's PID 1 (systemd) as seen from here: the descendant of nspawn whose command is systemd.
leader() {
  local pid child
  pid=$(pid_of "$1")
  for child in $(pgrep -P "$pid" 2>/dev/null); do
    if [ "$(cat "/proc/$child/comm" 2>/dev/null)" = systemd ]; then echo "$child"; return; fi
    for grandchild in $(pgrep -P "$child" 2>/dev/null); do
      [ "$(cat "/proc/$grandchild/comm" 2>/dev/null)" = systemd ] && { echo "$grandchild"; return; }
    done
  done
  # Not found yet (nspawn's children have not exec'd systemd): an empty answer, never a failure, which
  # `lead=$(leader ...)` under set -e would turn into a silent exit of the whole script.
  return 0
}

cmd_up() {
  local name=${1:?usage: hosts.sh up NAME ADDRESS [PORT] [IMAGE]} address=${2:?usage: hosts.sh up NAME ADDRESS [PORT] [IMAGE]}
  local port=${3:-22} image=${4:-}
  [[ $name =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] || die "host name '$name' must be lowercase letters, digits and dashes"
  [[ $address =~ ^127\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "address '$address' must be in 127.0.0.0/8 (test traffic stays on loopback)"
  [[ -z $image || $image =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] || die "image name '$image' must be lowercase letters, digits and dashes"
  need systemd-nspawn ssh-keygen
  cmd_base
  ensure_key
  local dir="$hosts/$name"
  if alive "$name"; then
    log "$name already running (pid $(pid_of "$name"))"
    return
  fi
  if ss -ltnH "src $address:$port" | grep -q .; then
    die "$address:$port is already taken by another process; choose another address for $name"
  fi
  local from=$base
  if [ -n "$image" ]; then
    # An image is used only while it was made from the current base; without it the host boots
    # from the base and the scenario installs what the image would have held (slower, same result).
    if [ "$(cat "$images/$image/.hicache-fleet-base" 2>/dev/null)" = "$base_packages" ] &&
      [ -f "$images/$image/.hicache-fleet-image" ]; then
      from="$images/$image"
    else
      log "host image $image not built (hosts.sh image $image): $name boots from the base rootfs"
    fi
  fi
  cmd_down "$name"
  mkdir -p "$dir"
  if overlay_ok; then
    # The host's root is an overlay: the base (or image) read-only below, the host's own changes
    # in hosts/NAME/upper. Nothing is copied, and `down` removes only what the host wrote.
    echo "$from" >"$dir/lower"
    mount_root "$name"
  else
    cp -a "$from" "$dir/root"
  fi
  local root="$dir/root"
  echo "$name" >"$root/etc/hostname"
  printf '127.0.0.1 localhost\n%s %s\n' "$address" "$name" >"$root/etc/hosts"
  od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$root/etc/machine-id"
  echo >>"$root/etc/machine-id"
  ssh-keygen -q -t ed25519 -N '' -f "$root/etc/ssh/ssh_host_ed25519_key" -C "root@$name"
  mkdir -p "$root/etc/ssh/sshd_config.d" "$root/root/.ssh"
  cat >"$root/etc/ssh/sshd_config.d/10-test-host.conf" <<EOF
# Written by hicache-fleet's test-host tool: this guest shares the machine's network,
# so its sshd binds only its own loopback address.
ListenAddress $address:$port
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
UseDNS no
EOF
  install -m 0600 "$key.pub" "$root/root/.ssh/authorized_keys"
  chmod 0700 "$root/root/.ssh"
  echo "$address" >"$dir/address"
  echo "$port" >"$dir/port"
  [ "$from" = "$base" ] || log "$name starts from host image $(basename "$from")"
  boot "$name"
}

# What a host image is made of, as one digest: the base, the wheelhouse, the role and the settings
# that install the venv. A change of any of them builds the image again.
image_key() {
  {
    echo "$base_packages"
    cat "$cache/wheelhouse/demo/SHA256SUMS"
    # Not the demo's run reports (inventories/demo/reports/): a demo run must not rebuild the image.
    (cd "$checkout" && find roles/sglang_venv inventories/demo playbooks/venv.yml requirements \
      -path inventories/demo/reports -prune -o -type f -print0 | sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-16
}

# Whether host image IMAGE exists and was made from what goes into it now (image_key).
image_current() {
  [ -f "$cache/wheelhouse/demo/SHA256SUMS" ] &&
    [ "$(cat "$images/$1/.hicache-fleet-image" 2>/dev/null)" = "$(image_key)" ]
}

cmd_image_current() {
  local image=${1:?usage: hosts.sh image-current sglang-venv}
  [ "$image" = sglang-venv ] || die "unknown host image '$image' (known: sglang-venv)"
  image_current "$image"
}

# Build host image IMAGE: boot a host from the base, install into it what the image holds (by the
# role that owns it, exactly as site.yml would), stop it and keep its root as images/IMAGE without
# its identity (hostname, machine-id, SSH host key and login key are written anew by `up`).
# Known images: sglang-venv (the demo fleet's venv release, built by playbooks/venv.yml with
# inventories/demo's settings; `current` is not switched, as site.yml leaves it).
cmd_image() {
  local image=${1:?usage: hosts.sh image sglang-venv} digest dir root rc=0
  [ "$image" = sglang-venv ] || die "unknown host image '$image' (known: sglang-venv)"
  [ -f "$cache/wheelhouse/demo/SHA256SUMS" ] || die "no demo wheelhouse yet: ansible-playbook playbooks/demo_prepare.yml"
  command -v ansible-playbook >/dev/null || die "ansible-playbook not in PATH (use the checkout's .venv)"
  cmd_base
  ensure_key
  if image_current "$image"; then
    log "host image $image cached: $images/$image"
    return
  fi
  digest=$(image_key)
  log "building host image $image (playbooks/venv.yml on $image_builder, $image_builder_address)"
  cmd_down "$image_builder"
  cmd_up "$image_builder" "$image_builder_address"
  dir="$hosts/$image_builder"
  root="$dir/root"
  [ -d "$root/etc" ] || die "no root for $image_builder at $root"
  printf '%s\n' "sglang_hosts:" "  hosts:" "    $image_builder:" \
    "      ansible_host: $image_builder_address" "      ansible_user: root" \
    "      ansible_ssh_private_key_file: $key" \
    "      ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null" \
    >"$dir/inventory.yml"
  HICACHE_FLEET_CACHE="$cache" ANSIBLE_CONFIG="$checkout/ansible.cfg" ANSIBLE_FACT_CACHING=memory \
    ansible-playbook -i "$checkout/inventories/demo" -i "$dir/inventory.yml" --limit "$image_builder" \
    "$checkout/playbooks/venv.yml" >"$dir/image.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 40 "$dir/image.log" >&2
    cmd_down "$image_builder"
    die "building host image $image failed (playbooks/venv.yml rc $rc)"
  fi
  cmd_stop "$image_builder"
  rm -f "$root"/etc/ssh/ssh_host_* "$root/etc/machine-id" "$root/etc/ssh/sshd_config.d/10-test-host.conf" \
    "$root/root/.ssh/authorized_keys"
  rm -rf "$root"/var/log/journal/*
  apt_clean "$root"
  echo "$digest" >"$root/.hicache-fleet-image"
  mkdir -p "$images"
  rm -rf "$images/$image.tmp" "$images/$image.old"
  cp -a "$root" "$images/$image.tmp"
  cmd_down "$image_builder"
  if [ -d "$images/$image" ]; then mv "$images/$image" "$images/$image.old"; fi
  mv "$images/$image.tmp" "$images/$image"
  rm -rf "$images/$image.old"
  log "host image $image ready: $images/$image ($(du -sh "$images/$image" | cut -f1))"
}

# Boot the guest's copy (hosts/NAME/root) and wait until systemd runs and SSH answers.
boot() {
  local name=$1 dir="$hosts/$1" address port
  address=$(cat "$dir/address")
  port=$(cat "$dir/port" 2>/dev/null || echo 22)
  # Detached boot; nspawn's own PID is recorded so that `down` can stop exactly this guest.
  setsid systemd-nspawn -b -D "$dir/root" -M "$name" --register=no --keep-unit --console=passive \
    >"$dir/console.log" 2>&1 </dev/null &
  echo $! >"$dir/nspawn.pid"
  log "booting $name on $address (nspawn pid $!)"
  local deadline=$((SECONDS + boot_timeout)) state=""
  while [ $SECONDS -lt $deadline ]; do
    alive "$name" || { tail -n 20 "$dir/console.log" >&2; die "$name exited during boot"; }
    local lead
    lead=$(leader "$name")
    if [ -n "$lead" ]; then
      state=$(nsenter -t "$lead" -a systemctl is-system-running 2>/dev/null || true)
      case $state in running | degraded)
        if ssh -n -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
          -o ConnectTimeout=2 -i "$key" -p "$port" "root@$address" true 2>/dev/null; then
          log "$name is up: systemd $state, ssh root@$address:$port"
          return
        fi ;;
      esac
    fi
    sleep 0.5
  done
  tail -n 20 "$dir/console.log" >&2
  cmd_down "$name"
  die "$name did not come up within ${boot_timeout}s (last state: ${state:-unknown})"
}

# Stop the guest by PID and keep its copy: to the controller it is a host that went away.
cmd_stop() {
  local name=${1:?usage: hosts.sh stop NAME} pid
  pid=$(pid_of "$name")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then stop_pid "$pid" "$name"; fi
}

# Boot a stopped guest again from its kept copy (what it had installed is still there).
cmd_start() {
  local name=${1:?usage: hosts.sh start NAME}
  [ -d "$hosts/$name/root" ] || die "$name has no kept copy; use: hosts.sh up NAME ADDRESS"
  need systemd-nspawn
  if alive "$name"; then
    log "$name already running (pid $(pid_of "$name"))"
    return
  fi
  [ ! -f "$hosts/$name/lower" ] || mount_root "$name"
  boot "$name"
}

# Overlay roots (no copy per host) unless HICACHE_FLEET_OVERLAY=0 or the kernel has no overlayfs;
# then each host gets a full `cp -a` copy, as before.
overlay_ok() { [ "${HICACHE_FLEET_OVERLAY:-1}" != 0 ] && grep -qw overlay /proc/filesystems; }

# Mount hosts/NAME/root as an overlay of the read-only lower root named in hosts/NAME/lower (the base
# or an image, never written to) and the host's own upper dir. Safe to repeat.
mount_root() {
  local dir="$hosts/$1" lower
  mountpoint -q "$dir/root" 2>/dev/null && return 0
  lower=$(cat "$dir/lower")
  [ -d "$lower/etc" ] || die "$1: its lower root $lower is gone"
  mkdir -p "$dir/upper" "$dir/work" "$dir/root"
  mount -t overlay "hicache-$1" -o "lowerdir=$lower,upperdir=$dir/upper,workdir=$dir/work" "$dir/root" ||
    die "$1: cannot mount its overlay root (set HICACHE_FLEET_OVERLAY=0 to copy the base instead)"
}

# SIGTERM a process by its PID, SIGKILL it if it is still there after 15 s. Usage: stop_pid PID LABEL
# (A zombie has exited already: it only waits for its parent to collect it.)
stop_pid() {
  local pid=$1 label=$2
  running() { kill -0 "$pid" 2>/dev/null && [ "$(sed -n 's/.*) \(.\).*/\1/p' "/proc/$pid/stat" 2>/dev/null)" != Z ]; }
  kill -TERM "$pid"
  for _ in $(seq 1 60); do running || break; sleep 0.25; done
  if running; then
    log "$label did not shut down in 15 s; killing pid $pid"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  log "stopped $label (pid $pid)"
}

cmd_down() {
  local name=${1:?usage: hosts.sh down NAME} dir pid
  dir="$hosts/$name"
  [ -d "$dir" ] || return 0
  pid=$(pid_of "$name")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then stop_pid "$pid" "$name"; fi
  if mountpoint -q "$dir/root" 2>/dev/null; then umount "$dir/root" || umount -l "$dir/root"; fi
  rm -rf "$dir"
}

# A controller-side process a scenario started (e.g. molecule/rollout's router): FILE holds
# "PID WORD"; the process is stopped only while its command line still contains WORD (a PID the
# kernel gave to another process since is left alone). FILE is removed.
cmd_stop_pid() {
  local file=${1:?usage: hosts.sh stop-pid FILE} pid word
  [ -f "$file" ] || return 0
  read -r pid word <"$file"
  if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$word"; then
    stop_pid "$pid" "$(basename "$file" .pid)"
  fi
  rm -f "$file"
}

cmd_list() {
  [ -d "$hosts" ] || return 0
  local d
  for d in "$hosts"/*/; do
    [ -d "$d" ] || continue
    local name
    name=$(basename "$d")
    printf '%s\t%s\t%s\n' "$name" "$(cat "$d/address" 2>/dev/null)" "$(alive "$name" && echo running || echo stopped)"
  done
}

cmd_destroy_all() {
  [ -d "$hosts" ] || return 0
  local d
  for d in "$hosts"/*/; do [ -d "$d" ] && cmd_down "$(basename "$d")"; done
  return 0
}

case ${1:-} in
  base) cmd_base ;;
  up) shift; cmd_up "$@" ;;
  image) shift; cmd_image "$@" ;;
  image-current) shift; cmd_image_current "$@" ;;
  down) shift; cmd_down "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  start) shift; cmd_start "$@" ;;
  stop-pid) shift; cmd_stop_pid "$@" ;;
  list) cmd_list ;;
  destroy-all) cmd_destroy_all ;;
  key) ensure_key; echo "$key" ;;
  *) sed -n '2,23p' "$0"; exit 2 ;;
esac
