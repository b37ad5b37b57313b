#!/usr/bin/env bash
# Make sure the PostgreSQL server the tests use (127.0.0.1:5432, trust auth, database `test`) runs.
set -euo pipefail
if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  exit 0
fi
if ls /etc/postgresql >/dev/null 2>&1; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi
for _ in $(seq 30); do
  pg_isready -q -h 127.0.0.1 -p 5432 && exit 0
  sleep 1
done
echo "PostgreSQL is not reachable on 127.0.0.1:5432; the registry tests on PostgreSQL need it" >&2
exit 1
