#!/usr/bin/env bash
# Makes sure the PostgreSQL the tests use answers on 127.0.0.1:5432, starting the local
# Debian cluster if it is installed but stopped. Fails loudly if it cannot.
set -euo pipefail

host=127.0.0.1
port=5432
if pg_isready -q -h "$host" -p "$port" 2>/dev/null; then
  exit 0
fi
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  echo "ensure-postgres: PostgreSQL is not answering on $host:$port and pg_ctlcluster is not installed" >&2
  exit 1
fi
version=$(ls /etc/postgresql | sort -V | tail -n 1)
echo "ensure-postgres: starting PostgreSQL $version (cluster main)" >&2
pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
for _ in $(seq 1 60); do
  if pg_isready -q -h "$host" -p "$port"; then
    exit 0
  fi
  sleep 0.5
done
echo "ensure-postgres: PostgreSQL did not come up on $host:$port" >&2
exit 1
