#!/usr/bin/env bash
# Two engines that share no filesystem with this host, standing in for engines on other
# machines: a docker engine (TLS, client certificates, 127.0.0.1:23750) and a podman API
# service (plain TCP, 127.0.0.1:23760), each in its own private mount namespace where fresh
# tmpfs cover /tmp, /run, /home, /root, /srv and the engines' storage — so no path this host
# makes exists for them. Only the filesystem is separate (same pid and network namespaces).
# They pull their images from the local TLS registry (scripts/setup-registry.sh), whose CA
# they trust through /etc/docker/certs.d and /etc/containers/certs.d (not covered).
# Idempotent; writes .remote.env. As root, after setup-engines.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
log=/var/log/toolseam
certs=/var/lib/toolseam-remote/certs   # not under a covered path: the engines read it too
mkdir -p "$log" "$certs"
DOCKER_PORT=23750
PODMAN_PORT=23760

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
if ! ping_tcp "${docker_ping[@]}"; then
  { private_root; cat <<SH; } >/run/toolseam/remote-docker.sh
exec dockerd -H tcp://127.0.0.1:$DOCKER_PORT --tlsverify --tlscacert $certs/ca.pem \
  --tlscert $certs/server-cert.pem --tlskey $certs/server-key.pem \
  --data-root /tmp/e/data --exec-root /tmp/e/exec --pidfile /tmp/e/dockerd.pid \
  --bridge=none --iptables=false --ip-masq=false --cgroup-parent /toolseam-remote-docker
SH
  setsid nohup unshare -m --propagation private sh /run/toolseam/remote-docker.sh \
    >"$log/remote-dockerd.log" 2>&1 </dev/null &
  wait_up "remote dockerd" "$log/remote-dockerd.log" "${docker_ping[@]}" &
  docker_wait=$!
fi

podman_ping=("http://127.0.0.1:$PODMAN_PORT/v4.0.0/libpod/_ping")
if ! ping_tcp "${podman_ping[@]}"; then
  { private_root; cat <<SH; } >/run/toolseam/remote-podman.sh
exec podman --root /tmp/e/root --runroot /tmp/e/run --tmpdir /tmp/e/tmp --storage-driver overlay \
  --cgroup-manager cgroupfs --events-backend file system service --time=0 tcp://127.0.0.1:$PODMAN_PORT
SH
  setsid nohup unshare -m --propagation private sh /run/toolseam/remote-podman.sh \
    >"$log/remote-podman.log" 2>&1 </dev/null &
  wait_up "remote podman service" "$log/remote-podman.log" "${podman_ping[@]}"
fi
[ -z "${docker_wait:-}" ] || wait "$docker_wait"

cat > .remote.env <<ENV
export TOOLSEAM_REMOTE_DOCKER_URL=tcp://127.0.0.1:$DOCKER_PORT
export TOOLSEAM_REMOTE_DOCKER_CERT_PATH=$certs
export TOOLSEAM_REMOTE_PODMAN_URL=tcp://127.0.0.1:$PODMAN_PORT
export TOOLSEAM_REMOTE_IMAGE=127.0.0.1:5443/toolseam/sandbox:latest
ENV
echo "remote engines ready: docker (TLS) on :$DOCKER_PORT, podman on :$PODMAN_PORT"
