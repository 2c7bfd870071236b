#!/usr/bin/env bash
# The whole test suite, on a fresh machine: starts PostgreSQL if it is down, installs the
# external clients the tests use (scripts/test-tools.sh), then runs every
# test (unit, property, integration against PostgreSQL and the embedded Kafka broker).
# Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${HISTORY_TEST_DATABASE_URL:-}" ]; then
  scripts/ensure-postgres.sh
fi
scripts/ensure-build-deps.sh
scripts/test-tools.sh
# The tests drive both binaries (history-service, and history-dev for the demo, the bench and
# the embedded broker): build them first.
cargo build --locked --workspace --bins
cargo test --locked --workspace "$@"
