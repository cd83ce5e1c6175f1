#!/usr/bin/env bash
# Debian's Prometheus server, for the test that scrapes `toolseam metrics` and queries it with
# PromQL (tests/host/test_metrics_prometheus.py). Only the binary: the package's own service is
# refused at install (policy-rc.d) — the test starts its own on 127.0.0.1. Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
log=/var/log/toolseam
mkdir -p "$log"
if ! dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q "ok installed"; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  { apt-get update -q && apt-get install -y -q --no-install-recommends prometheus; } \
    >"$log/apt-prometheus.log" 2>&1 \
    || { rm -f /usr/sbin/policy-rc.d; tail -n 30 "$log/apt-prometheus.log"; exit 1; }
  rm -f /usr/sbin/policy-rc.d
fi
command -v prometheus >/dev/null
