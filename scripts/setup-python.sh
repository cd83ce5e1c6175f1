#!/usr/bin/env bash
# Creates .venv with toolseam and its dependencies (extras as arguments, e.g. "dev").
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  apt-get update -q && apt-get install -y -q python3-venv
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install -q -e ".[$extras]"
else
  .venv/bin/python -m pip install -q -e .
fi
