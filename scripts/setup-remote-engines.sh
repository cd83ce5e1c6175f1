#!/usr/bin/env bash
# Two engines that share no filesystem with this host, standing in for engines on other
# machines: a docker engine (TLS, client certificates, 127.0.0.1:23750) and a podman API
# service (plain TCP, 127.0.0.1:23760), each in its own private mount namespace where fresh
# tmpfs cover /tmp, /run, /home, /root, /srv and the engines' storage — so no path this host
# makes exists for them. Only the filesystem is separate (same pid and network namespaces).
# They pull their images from the local TLS registry (scripts/setup-registry.sh), whose CA
# they trust through /etc/docker/certs.d and /etc/containers/certs.d (not covered).
# Each engine's namespace also runs an ssh server (127.0.0.1:2222 docker, :2223 podman), so
# the same engines are reachable as ssh://toolseam-remote-docker and ssh://toolseam-remote-podman
# (their unix sockets, forwarded by ssh): Host entries in root's ~/.ssh/config (an Include of
# /var/lib/toolseam-remote/ssh/client_config) name the key and port, as an operator would.
# Idempotent; writes .remote.env. As root, after setup-engines.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
log=/var/log/toolseam
certs=/var/lib/toolseam-remote/certs   # not under a covered path: the engines read it too
ssh_dir=/var/lib/toolseam-remote/ssh
mkdir -p "$log" "$certs" "$ssh_dir"
DOCKER_PORT=23750
PODMAN_PORT=23760
SSH_PORT=2222
PODMAN_SSH_PORT=2223

# an ssh server (not started as a service: a policy-rc.d refuses during the install) and client
need=()
for pkg in openssh-server openssh-client socat; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -q "${need[@]}" >"$log/apt-ssh.log" 2>&1 \
    || { rm -f /usr/sbin/policy-rc.d; tail -n 30 "$log/apt-ssh.log"; exit 1; }
  rm -f /usr/sbin/policy-rc.d
fi
[ -s "$ssh_dir/host_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -f "$ssh_dir/host_ed25519"
[ -s "$ssh_dir/id_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -f "$ssh_dir/id_ed25519"
cp "$ssh_dir/id_ed25519.pub" "$ssh_dir/authorized_keys"
sshd_config() {  # port -> an sshd config for one engine's namespace
  cat >"$ssh_dir/sshd_config-$1" <<CONF
Port $1
ListenAddress 127.0.0.1
HostKey $ssh_dir/host_ed25519
AuthorizedKeysFile $ssh_dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowStreamLocalForwarding yes
PidFile /run/sshd-toolseam.pid
CONF
}
sshd_config "$SSH_PORT"
sshd_config "$PODMAN_SSH_PORT"
: >"$ssh_dir/client_config"
for entry in "toolseam-remote-docker $SSH_PORT" "toolseam-remote-podman $PODMAN_SSH_PORT"; do
  set -- $entry
  cat >>"$ssh_dir/client_config" <<CONF
Host $1
  HostName 127.0.0.1
  Port $2
  User root
  IdentityFile $ssh_dir/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking accept-new
  UserKnownHostsFile $ssh_dir/known_hosts
CONF
done
mkdir -p /root/.ssh && chmod 0700 /root/.ssh
if ! grep -qs "Include $ssh_dir/client_config" /root/.ssh/config; then
  { echo "Include $ssh_dir/client_config"; cat /root/.ssh/config 2>/dev/null || true; } >/root/.ssh/config.new
  mv /root/.ssh/config.new /root/.ssh/config && chmod 0600 /root/.ssh/config
fi

# TLS for the remote docker engine: a CA, a server certificate for 127.0.0.1, a client one
if [ ! -s "$certs/key.pem" ]; then
  cd "$certs"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=toolseam remote engines CA" \
    -keyout ca-key.pem -out ca.pem >/dev/null 2>&1
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout server-key.pem \
    -out server.csr >/dev/null 2>&1
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 3650 \
    -extfile server.ext -out server-cert.pem >/dev/null 2>&1
  openssl req -newkey rsa:2048 -nodes -subj "/CN=toolseam client" -keyout key.pem \
    -out client.csr >/dev/null 2>&1
  printf 'extendedKeyUsage=clientAuth\n' >client.ext
  openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 3650 \
    -extfile client.ext -out cert.pem >/dev/null 2>&1
  chmod 0600 ./*-key.pem key.pem
  cd - >/dev/null
fi

# The body run inside `unshare -m --propagation private`: cover every path the host could
# share (unmounting inherited submounts first, in this namespace only), then exec the engine.
private_root() {
  cat <<'SH'
set -e
for d in /tmp /var/tmp /run /dev/shm /root /home /srv /var/lib/docker /var/lib/containers; do
  for m in $(awk -v d="$d" '$5 ~ "^"d"/" {print $5}' /proc/self/mountinfo | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  mkdir -p "$d" && mount -t tmpfs -o mode=1777 tmpfs "$d"
done
mkdir -p /tmp/e
SH
}

ping_tcp() { curl -fsS --max-time 2 "$@" >/dev/null 2>&1; }
wait_up() {  # what, log, curl args...
  local what=$1 logfile=$2; shift 2
  for _ in $(seq 1 150); do ping_tcp "$@" && return 0; sleep 0.2; done
  echo "$what did not come up" >&2; tail -n 30 "$logfile" >&2; return 1
}

docker_ping=(--cacert "$certs/ca.pem" --cert "$certs/cert.pem" --key "$certs/key.pem"
             "https://127.0.0.1:$DOCKER_PORT/_ping")
ssh_up() { timeout 2 bash -c "</dev/tcp/127.0.0.1/$1" 2>/dev/null; }
stop_engine() {  # pattern, ping args...: an engine started before its ssh server was added
  local pattern=$1; shift
  for pid in $(pgrep -f "$pattern" || true); do
    kill -- "-$(ps -o sid= "$pid" | tr -d ' ')" 2>/dev/null || kill "$pid" || true
  done
  for _ in $(seq 1 50); do ping_tcp "$@" || break; sleep 0.2; done
}
if ping_tcp "${docker_ping[@]}" && ! ssh_up "$SSH_PORT"; then
  stop_engine "dockerd -H tcp://127.0.0.1:$DOCKER_PORT" "${docker_ping[@]}"
fi
if ! ping_tcp "${docker_ping[@]}"; then
  { private_root; cat <<SH; } >/run/toolseam/remote-docker.sh
mkdir -p /run/sshd && /usr/sbin/sshd -D -f $ssh_dir/sshd_config-$SSH_PORT &
exec dockerd -H tcp://127.0.0.1:$DOCKER_PORT -H unix:///run/docker-remote.sock \
  --tlsverify --tlscacert $certs/ca.pem \
  --tlscert $certs/server-cert.pem --tlskey $certs/server-key.pem \
  --data-root /tmp/e/data --exec-root /tmp/e/exec --pidfile /tmp/e/dockerd.pid \
  --bridge=none --iptables=false --ip-masq=false --cgroup-parent /toolseam-remote-docker
SH
  env -C / setsid nohup unshare -m --propagation private sh /run/toolseam/remote-docker.sh \
    >"$log/remote-dockerd.log" 2>&1 </dev/null &
  wait_up "remote dockerd" "$log/remote-dockerd.log" "${docker_ping[@]}" &
  docker_wait=$!
fi

podman_ping=("http://127.0.0.1:$PODMAN_PORT/v4.0.0/libpod/_ping")
if ping_tcp "${podman_ping[@]}" && ! ssh_up "$PODMAN_SSH_PORT"; then
  stop_engine "service --time=0 tcp://127.0.0.1:$PODMAN_PORT" "${podman_ping[@]}"
fi
if ! ping_tcp "${podman_ping[@]}"; then
  # one API service; a unix socket in the namespace (for ssh to forward) relays to it.
  # sshd -D stays in this session: stopping the engine's session group stops it too.
  { private_root; cat <<SH; } >/run/toolseam/remote-podman.sh
mkdir -p /run/sshd && /usr/sbin/sshd -D -f $ssh_dir/sshd_config-$PODMAN_SSH_PORT &
socat UNIX-LISTEN:/run/podman-remote.sock,fork,mode=600 TCP:127.0.0.1:$PODMAN_PORT &
exec podman --root /tmp/e/root --runroot /tmp/e/run --tmpdir /tmp/e/tmp --storage-driver overlay \
  --cgroup-manager cgroupfs --events-backend file system service --time=0 tcp://127.0.0.1:$PODMAN_PORT
SH
  env -C / setsid nohup unshare -m --propagation private sh /run/toolseam/remote-podman.sh \
    >"$log/remote-podman.log" 2>&1 </dev/null &
  wait_up "remote podman service" "$log/remote-podman.log" "${podman_ping[@]}"
fi
[ -z "${docker_wait:-}" ] || wait "$docker_wait"

cat > .remote.env <<ENV
export TOOLSEAM_REMOTE_DOCKER_URL=tcp://127.0.0.1:$DOCKER_PORT
export TOOLSEAM_REMOTE_DOCKER_CERT_PATH=$certs
export TOOLSEAM_REMOTE_PODMAN_URL=tcp://127.0.0.1:$PODMAN_PORT
export TOOLSEAM_REMOTE_DOCKER_SSH_URL=ssh://toolseam-remote-docker/run/docker-remote.sock
export TOOLSEAM_REMOTE_PODMAN_SSH_URL=ssh://toolseam-remote-podman/run/podman-remote.sock
export TOOLSEAM_REMOTE_IMAGE=127.0.0.1:5443/toolseam/sandbox:latest
ENV
echo "remote engines ready: docker (TLS) on :$DOCKER_PORT, podman on :$PODMAN_PORT, both over ssh too"
