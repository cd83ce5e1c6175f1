#!/usr/bin/env bash
# Two local image registries for the pull tests, as an operator would run them: Debian's
# docker-registry on 127.0.0.1 with TLS from a self-signed CA that every engine trusts through
# its certs.d directory (no insecure flag anywhere), one open (:5443) and one behind htpasswd
# (:5444). The reference sandbox image is pushed to both. Idempotent; writes .registry.env.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
log=/var/log/toolseam
state=/var/lib/toolseam-registry
mkdir -p "$log" "$state"
need=()
for pkg in docker-registry apache2-utils openssl curl; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q >"$log/apt-registry.log" 2>&1
  apt-get install -y -q "${need[@]}" >>"$log/apt-registry.log" 2>&1 || { tail -n 40 "$log/apt-registry.log"; exit 1; }
fi

# a CA, and a certificate for 127.0.0.1 signed by it
if [ ! -s "$state/server.crt" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=toolseam test CA" \
    -keyout "$state/ca.key" -out "$state/ca.crt" >/dev/null 2>&1
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$state/server.key" -out "$state/server.csr" >/dev/null 2>&1
  printf 'subjectAltName=IP:127.0.0.1\n' >"$state/san.ext"
  openssl x509 -req -in "$state/server.csr" -CA "$state/ca.crt" -CAkey "$state/ca.key" \
    -CAcreateserial -days 3650 -extfile "$state/san.ext" -out "$state/server.crt" >/dev/null 2>&1
fi
[ -s "$state/htpasswd" ] || htpasswd -Bbn toolseam "s3cret-pass" >"$state/htpasswd"

# every engine trusts the CA for both registries (rootless podman reads /etc/containers too)
for port in 5443 5444; do
  for dir in /etc/docker/certs.d /etc/containers/certs.d; do
    mkdir -p "$dir/127.0.0.1:$port"
    cp "$state/ca.crt" "$dir/127.0.0.1:$port/ca.crt"
  done
done

start_registry() {  # name, port, extra auth yaml
  local name=$1 port=$2 auth=$3
  mkdir -p "$state/$name/data"
  cat >"$state/$name/config.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $state/$name/data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
  tls:
    certificate: $state/server.crt
    key: $state/server.key
$auth
YAML
  if ! curl -fsS --max-time 2 --cacert "$state/ca.crt" -o /dev/null "https://127.0.0.1:$port/v2/" 2>/dev/null \
     && ! curl -sS --max-time 2 --cacert "$state/ca.crt" -o /dev/null -w '%{http_code}' "https://127.0.0.1:$port/v2/" 2>/dev/null | grep -q 401; then
    env -C / setsid nohup docker-registry serve "$state/$name/config.yml" >"$log/registry-$name.log" 2>&1 </dev/null &
    for _ in $(seq 1 50); do
      code=$(curl -sS --max-time 1 --cacert "$state/ca.crt" -o /dev/null -w '%{http_code}' "https://127.0.0.1:$port/v2/" 2>/dev/null || true)
      [ "$code" = 200 ] || [ "$code" = 401 ] && return 0
      sleep 0.1
    done
    echo "registry $name did not come up on :$port" >&2; tail -n 20 "$log/registry-$name.log" >&2; return 1
  fi
}
start_registry open 5443 ""
start_registry auth 5444 "auth:
  htpasswd:
    realm: toolseam
    path: $state/htpasswd"

# the reference image in both (a push is cheap once its layers are there)
image=localhost/toolseam-sandbox:latest
podman push -q "$image" 127.0.0.1:5443/toolseam/sandbox:latest >"$log/push.log" 2>&1
podman push -q --creds toolseam:s3cret-pass "$image" 127.0.0.1:5444/toolseam/sandbox:latest >>"$log/push.log" 2>&1

cat >.registry.env <<ENV
export TOOLSEAM_REGISTRY=127.0.0.1:5443
export TOOLSEAM_AUTH_REGISTRY=127.0.0.1:5444
export TOOLSEAM_AUTH_USER=toolseam
export TOOLSEAM_AUTH_PASSWORD=s3cret-pass
ENV
echo "registries ready: 127.0.0.1:5443 (open), 127.0.0.1:5444 (htpasswd), both TLS"
