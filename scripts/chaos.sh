#!/usr/bin/env bash
# The long chaos run (docs/reliability.md): 100,000 records over five minutes per scenario, the
# service killed and restarted, PostgreSQL restarted, sessions cut, broker faults injected; then
# every invariant checked from outside. Release build. Prints the figures and keeps them in
# target/chaos-report/. A failing run prints its seed: HISTORY_CHAOS_SEED=<seed> replays it.
#
#   scripts/chaos.sh                                  # the long mode
#   HISTORY_CHAOS_RECORDS=20000 HISTORY_CHAOS_SECONDS=120 scripts/chaos.sh
set -euo pipefail
cd "$(dirname "$0")/.."

export HISTORY_CHAOS_RECORDS="${HISTORY_CHAOS_RECORDS:-100000}"
export HISTORY_CHAOS_SECONDS="${HISTORY_CHAOS_SECONDS:-300}"
export HISTORY_CHAOS_REPORT_DIR="${HISTORY_CHAOS_REPORT_DIR:-$PWD/target/chaos-report}"
rm -rf "$HISTORY_CHAOS_REPORT_DIR"
# Both binaries in release first: the run drives `history-dev dev-kafka` as its broker, and
# `cargo test` builds only this package's binaries (a stale history-dev would go unnoticed).
cargo build --release --locked --workspace --bins
cargo test --release --locked --test chaos -- --nocapture --test-threads=1
echo
cat "$HISTORY_CHAOS_REPORT_DIR"/*.txt
