#!/usr/bin/env bash
# Installs and starts every engine the container tests need, from a fresh Debian machine, as
# root: podman (rootful and rootless, runc), the podman API services, a docker engine, a
# rootless user, and the sandbox images. Idempotent. Writes .engines.env for the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
ROOTLESS_USER=toolseam-rootless
log=/var/log/toolseam
mkdir -p "$log" /run/toolseam

need=()
# openssh-server, redis-server/redis-tools: the captured-egress tests (tests/test_egress_captured.py)
for pkg in podman runc uidmap slirp4netns fuse-overlayfs docker.io debootstrap busybox-static catatonit util-linux curl musl-tools openssh-server redis-server redis-tools; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q >"$log/apt.log" 2>&1
  apt-get install -y -q "${need[@]}" >>"$log/apt.log" 2>&1 || { tail -n 40 "$log/apt.log"; exit 1; }
fi

# crun fails here (cgroups in hybrid mode): runc for every podman, rootful and rootless.
conf=/etc/containers/containers.conf
if ! grep -qs '^runtime *= *"runc"' "$conf"; then
  mkdir -p /etc/containers
  printf '[engine]\nruntime = "runc"\n' >>"$conf"
fi

# Daemons start in / (env -C /): one started in this checkout would keep it as its working
# directory, and its children (conmon) fail once the checkout is deleted.
wait_for_socket() {  # path, seconds, what
  for _ in $(seq 1 $(( $2 * 10 ))); do [ -S "$1" ] && return 0; sleep 0.1; done
  echo "$3 did not come up ($1)" >&2; return 1
}
ping_unix() { curl -fsS --max-time 2 --unix-socket "$1" "http://d/$2" >/dev/null 2>&1; }

# docker engine: no systemd here; no bridge (sandboxes run with --network=none)
if ! ping_unix /var/run/docker.sock _ping; then
  env -C / setsid nohup dockerd --bridge=none --iptables=false --ip-masq=false >"$log/dockerd.log" 2>&1 < /dev/null &
  wait_for_socket /var/run/docker.sock 30 dockerd
  for _ in $(seq 1 100); do ping_unix /var/run/docker.sock _ping && break; sleep 0.2; done
fi

# rootful podman API service
if ! ping_unix /run/toolseam/podman.sock v4.0.0/libpod/_ping; then
  rm -f /run/toolseam/podman.sock
  env -C / setsid nohup podman system service --time=0 unix:///run/toolseam/podman.sock >"$log/podman.log" 2>&1 < /dev/null &
  wait_for_socket /run/toolseam/podman.sock 30 "podman service"
fi

# rootless podman: a user with subordinate ids, its own runtime dir and API service
id "$ROOTLESS_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$ROOTLESS_USER"
uid=$(id -u "$ROOTLESS_USER")
grep -q "^$ROOTLESS_USER:" /etc/subuid || echo "$ROOTLESS_USER:200000:65536" >>/etc/subuid
grep -q "^$ROOTLESS_USER:" /etc/subgid || echo "$ROOTLESS_USER:200000:65536" >>/etc/subgid
runtime_dir=/run/user/$uid
mkdir -p "$runtime_dir/podman" && chown -R "$ROOTLESS_USER:" "$runtime_dir" && chmod 0700 "$runtime_dir"
home=$(getent passwd "$ROOTLESS_USER" | cut -d: -f6)
as_user() { su -s /bin/sh "$ROOTLESS_USER" -c "cd /tmp && XDG_RUNTIME_DIR=$runtime_dir $*"; }
su -s /bin/sh "$ROOTLESS_USER" -c "mkdir -p $home/.config/containers && printf '[engine]\nruntime = \"runc\"\n' > $home/.config/containers/containers.conf"
# native overlay (the kernel allows it unprivileged; /dev/fuse is not open to users here): the
# default here, vfs, copies the whole image per container (seconds per start). A store already
# made with vfs is reset first, with the old config.
rootless_sock=$runtime_dir/podman/podman.sock
storage_conf=$home/.config/containers/storage.conf
if [ "$(as_user podman info --format '{{.Store.GraphDriverName}}' 2>/dev/null)" != overlay ] \
   || grep -qs mount_program "$storage_conf"; then
  pkill -u "$ROOTLESS_USER" -f "podman system service" || true
  rm -f "$storage_conf" "$rootless_sock"
  as_user podman system reset --force >"$log/podman-rootless-reset.log" 2>&1 || true
  su -s /bin/sh "$ROOTLESS_USER" -c "printf '[storage]\ndriver = \"overlay\"\n' > $storage_conf"
fi
if ! ping_unix "$rootless_sock" v4.0.0/libpod/_ping; then
  rm -f "$rootless_sock"
  env -C / setsid nohup su -s /bin/sh "$ROOTLESS_USER" -c \
    "cd /tmp && XDG_RUNTIME_DIR=$runtime_dir podman system service --time=0 unix://$rootless_sock" \
    >"$log/podman-rootless.log" 2>&1 < /dev/null &
  wait_for_socket "$rootless_sock" 30 "rootless podman service"
fi

# images, for each engine (skipped when present)
have() { "$@" >/dev/null 2>&1; }
have podman image exists localhost/toolseam-musl:latest || images/build.sh podman
have as_user podman image exists localhost/toolseam-musl:latest || images/build.sh podman --user "$ROOTLESS_USER"
have /usr/bin/docker image inspect localhost/toolseam-musl:latest || images/build.sh docker

cat > .engines.env <<ENV
export TOOLSEAM_PODMAN_URL=unix:///run/toolseam/podman.sock
export TOOLSEAM_PODMAN_ROOTLESS_URL=unix://$rootless_sock
export TOOLSEAM_ROOTLESS_USER=$ROOTLESS_USER
export TOOLSEAM_DOCKER_URL=unix:///var/run/docker.sock
export TOOLSEAM_IMAGE=localhost/toolseam-sandbox:latest
export TOOLSEAM_REQUIRE_ENGINES=1
ENV
# local registries (TLS, one behind htpasswd) with the reference image, for the pull tests
scripts/setup-registry.sh
cat .registry.env >> .engines.env
# engines that share no filesystem with this host (stand-ins for other machines)
scripts/setup-remote-engines.sh
cat .remote.env >> .engines.env
echo "engines ready: podman (rootful, rootless as $ROOTLESS_USER), docker"
