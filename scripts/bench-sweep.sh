#!/usr/bin/env bash
# How throughput changes with writers, batch size and partitions: runs `history-dev bench`
# (release build) once per setting and prints one RESULT line each, for docs/benchmarks.md.
#
#   scripts/bench-sweep.sh                 # 200,000 records per run
#   EVENTS=500000 scripts/bench-sweep.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-postgres.sh
cargo build --release --locked --workspace
events="${EVENTS:-200000}"
log=target/bench-sweep.log
: >"$log"
run() {
  printf '%-34s ' "$*"
  if ! target/release/history-dev bench --events "$events" --naive-events 300 \
    --latency-seconds 2 "$@" 2>>"$log" | tail -n 1; then
    echo "FAILED (see $log)"
  fi
}
for writers in 1 2 4; do run --writers "$writers" --batch 1000 --partitions 24; done
for batch in 100 500 2000; do run --writers 2 --batch "$batch" --partitions 24; done
for partitions in 12 48; do run --writers 2 --batch 1000 --partitions "$partitions"; done
