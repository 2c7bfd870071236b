#!/usr/bin/env bash
# Shows that the tests catch broken builds. Each patch in scripts/mutants/ breaks one rule the
# design rests on (the inbox marker committed in its own transaction; the committer moving past
# an unresolved offset; no deadline on a write transaction). With the patch applied, its test
# must fail; this script exits non-zero if any mutant survives. Takes a few minutes per mutant.
# A patch's test is the chaos run unless its header names another: a line `Test: ARGS` (what
# follows `cargo test`) and a line `Caught: TEXT` (what the failing test's output says).
#
#   scripts/chaos-mutants.sh            # every mutant, a fresh seed each
#   scripts/chaos-mutants.sh redelivery-applied-again   # the named ones only
#   HISTORY_CHAOS_SEED=42 scripts/chaos-mutants.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ -z "${HISTORY_TEST_DATABASE_URL:-}" ]; then
  scripts/ensure-postgres.sh
fi
work=$(mktemp -d /tmp/history-mutant-XXXXXX)
cleanup() { git worktree remove --force "$work" >/dev/null 2>&1 || rm -rf "$work"; }
trap cleanup EXIT
git worktree add --detach "$work" HEAD >/dev/null
# A target directory of its own: a mutant built into the normal one would look up to date
# to cargo afterwards (same package, same metadata) and be tested in place of the real build.
export CARGO_TARGET_DIR="${HISTORY_MUTANTS_TARGET_DIR:-$root/target/mutants}"

mkdir -p "$CARGO_TARGET_DIR"
survivors=0
patches=()
if [ "$#" -gt 0 ]; then
  for name in "$@"; do
    [ -f "scripts/mutants/$name.patch" ] || { echo "no mutant $name in scripts/mutants/" >&2; exit 2; }
    patches+=("scripts/mutants/$name.patch")
  done
else
  patches=(scripts/mutants/*.patch)
fi
for patch in "${patches[@]}"; do
  name=$(basename "$patch" .patch)
  log="$CARGO_TARGET_DIR/mutant-$name.log"
  (cd "$work" && git checkout -q -- . && git apply "$root/$patch")
  echo "== mutant $name (log: $log)"
  test_args=$(sed -n 's/^Test: //p' "$patch" | head -n 1)
  caught=$(sed -n 's/^Caught: //p' "$patch" | head -n 1)
  if [ -n "$test_args" ]; then
    # shellcheck disable=SC2086 # the header holds several arguments
    if (cd "$work" && cargo build --workspace --bins && cargo test $test_args -- --nocapture) >"$log" 2>&1; then
      if grep -q "^running 0 tests" "$log" && ! grep -q "^running [1-9]" "$log"; then
        echo "   RAN NOTHING: $test_args names no test that runs (an ignored one?)"
      else
        echo "   SURVIVED: $test_args passed with this rule broken"
      fi
      survivors=$((survivors + 1))
    elif grep -qF "$caught" "$log"; then
      echo "   caught: $(grep -m1 -F "$caught" "$log" | cut -c1-160)"
    else
      echo "   the run failed for another reason; see the log"
      survivors=$((survivors + 1))
    fi
    continue
  fi
  if (cd "$work" && cargo build --workspace --bins && cargo test --test chaos kills_database -- --nocapture) >"$log" 2>&1; then
    echo "   SURVIVED: the chaos test passed with this rule broken"
    survivors=$((survivors + 1))
  elif grep -q "violations\|events lost\|events recorded twice" "$log"; then
    echo "   caught: $(grep -m1 -o 'lost [0-9]*  doubled [0-9]*  commit-order violations [0-9]*' "$log" || echo 'the invariants failed')"
  else
    echo "   the run failed for another reason; see the log"
    survivors=$((survivors + 1))
  fi
done
exit "$survivors"
