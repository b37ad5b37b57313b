#!/usr/bin/env bash
# Idempotent set-up: Debian tools the project uses, a virtualenv, the pinned Python dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chattr >/dev/null; then   # tests make directories undeletable with chattr +i
  apt-get update -qq && apt-get install -y -qq e2fsprogs
fi
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -e "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[api,postgres,kubernetes,test,bench]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
