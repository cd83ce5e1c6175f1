#!/usr/bin/env bash
# Build the reference sandbox image for one engine.
#
#   images/build.sh podman|docker [--user NAME] [--base IMAGE]
#
# Without --base (these machines: no registry), the base is debootstrapped from the Debian
# mirror apt already uses and imported as localhost/toolseam-base:bookworm; with --base, the
# Containerfile builds FROM that image (e.g. docker.io/library/debian:bookworm-slim).
# --user builds into a rootless podman user's own storage.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
engine="$1"; shift
user=""; base=""
while [ $# -gt 0 ]; do
  case "$1" in
    --user) user="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
cache=/var/cache/toolseam
# the engine's own client: a newer CLI elsewhere on PATH may not speak to docker.io 20.10
docker=/usr/bin/docker; [ -x "$docker" ] || docker=$(command -v docker || echo docker)
tarball="$cache/bookworm-python3.tar"
run() {  # run an engine command as root or as the rootless user
  if [ -n "$user" ]; then
    su -s /bin/sh "$user" -c "cd /tmp && XDG_RUNTIME_DIR=/run/user/$(id -u "$user") $*"
  else
    sh -c "$*"
  fi
}
import_image() {  # tarball, image name: a rootfs tarball as an image of this engine
  case "$engine" in
    podman) run "podman import --quiet $1 $2" >/dev/null ;;
    docker) "$docker" import "$1" "$2" >/dev/null ;;
  esac
}
if [ -z "$base" ]; then
  if [ ! -s "$tarball" ]; then
    mkdir -p "$cache"
    # the Debian mirror apt already uses (not a third-party repository listed beside it)
    mirror=$( { grep -rhoE '^(URIs:|deb) *https?://[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true; } \
             | grep -oE 'https?://[^ ]+/debian/?$' | grep -v security | head -n1 || true)
    mirror="${mirror:-http://deb.debian.org/debian}"
    rm -rf "$cache/rootfs"
    debootstrap --variant=minbase --include=python3 bookworm "$cache/rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 \
      || { tail -n 30 "$cache/debootstrap.log" >&2; exit 1; }
    tar -C "$cache/rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$cache/rootfs"
  fi
  chmod 0755 "$cache"; chmod 0644 "$tarball"
  import_image "$tarball" localhost/toolseam-base:bookworm
  base=localhost/toolseam-base:bookworm
fi
case "$engine" in
  podman) run "podman build --quiet --network=none --build-arg BASE=$base -t localhost/toolseam-sandbox:latest -f $here/Containerfile $here" >/dev/null ;;
  docker) DOCKER_BUILDKIT=0 "$docker" build --quiet --network=none --build-arg "BASE=$base" \
            -t localhost/toolseam-sandbox:latest -f "$here/Containerfile" "$here" >/dev/null ;;
  *) echo "engine must be podman or docker" >&2; exit 2 ;;
esac
# A 2 MB busybox-only image (no python3, no libc), for the foreign-image tests.
nopy="$cache/nopython.tar"
if [ ! -s "$nopy" ]; then
  rm -rf "$cache/nopython"; mkdir -p "$cache/nopython/bin"
  cp /bin/busybox "$cache/nopython/bin/busybox"
  for tool in sh sleep cat true; do ln -sf busybox "$cache/nopython/bin/$tool"; done
  tar -C "$cache/nopython" -cf "$nopy" . && chmod 0644 "$nopy"
fi
import_image "$nopy" localhost/toolseam-nopython:latest
# A musl userland (no glibc anywhere): busybox, musl's libc and loader from Debian's musl
# package, and a program linked against musl by musl-gcc, which the tests run.
musl="$cache/musl.tar"
if [ ! -s "$musl" ]; then
  arch=$(uname -m)
  rm -rf "$cache/musl"; mkdir -p "$cache/musl/bin" "$cache/musl/lib" "$cache/musl/usr/lib/$arch-linux-musl"
  cp /bin/busybox "$cache/musl/bin/busybox"
  for tool in sh sleep cat true ls; do ln -sf busybox "$cache/musl/bin/$tool"; done
  cp "/usr/lib/$arch-linux-musl/libc.so" "$cache/musl/usr/lib/$arch-linux-musl/libc.so"
  ln -sf "../usr/lib/$arch-linux-musl/libc.so" "$cache/musl/lib/ld-musl-$arch.so.1"
  printf '#include <stdio.h>\nint main(void) { puts("hello from musl"); return 0; }\n' >"$cache/hello-musl.c"
  musl-gcc -O2 -o "$cache/musl/bin/hello-musl" "$cache/hello-musl.c"
  tar -C "$cache/musl" -cf "$musl" . && chmod 0644 "$musl"
fi
import_image "$musl" localhost/toolseam-musl:latest
# Debian without python: the reference rootfs with every python binary and library taken out.
debnopy="$cache/debian-nopython.tar"
if [ ! -s "$debnopy" ] && [ -s "$tarball" ]; then
  cp "$tarball" "$debnopy.tmp"
  tar --delete --wildcards -f "$debnopy.tmp" './usr/bin/python3*' './usr/lib/python3*' \
    './usr/lib/python3.11*' './usr/lib/x86_64-linux-gnu/libpython3*' 2>/dev/null || true
  mv "$debnopy.tmp" "$debnopy" && chmod 0644 "$debnopy"
fi
[ ! -s "$debnopy" ] || import_image "$debnopy" localhost/toolseam-debian-nopython:latest
echo "built localhost/toolseam-sandbox:latest for $engine${user:+ (rootless, $user)}"
