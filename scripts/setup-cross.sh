#!/usr/bin/env bash
# What the arm64 agent test needs on an amd64 Debian machine: apt knowing arm64 (the agent
# bundle for arm64 is assembled from Debian's arm64 packages) and qemu-user to run it.
# Idempotent; as root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
log=/var/log/toolseam
mkdir -p "$log"
[ "$(dpkg --print-architecture)" = arm64 ] && exit 0  # an arm64 machine builds it natively
if ! dpkg --print-foreign-architectures | grep -qx arm64 \
   || ! ls /var/lib/apt/lists/ | grep -q '_binary-arm64_Packages'; then
  dpkg --add-architecture arm64
  apt-get update -q >"$log/apt-cross.log" 2>&1 || { tail -n 30 "$log/apt-cross.log"; exit 1; }
fi
if ! dpkg-query -W -f='${Status}' qemu-user-static 2>/dev/null | grep -q "ok installed"; then
  apt-get install -y -q qemu-user-static >>"$log/apt-cross.log" 2>&1 \
    || { tail -n 30 "$log/apt-cross.log"; exit 1; }
fi
echo "cross-build ready: apt knows arm64, qemu-aarch64-static installed"
