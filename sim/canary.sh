#!/usr/bin/env bash
# Proves the simulator has teeth: builds the provider with one fencing check removed
# (feature sim-canary, via the sim crate's `canary` feature) and asserts that the simulator
# finds a failing seed within the budget. CI calls this after the workspace tests.
#
# It fails unless the canary test actually ran and passed: a build in which the test compiled
# away (the feature not applied) or a filter that matched nothing runs no test, and cargo
# reports that as a success.
set -euo pipefail
cd "$(dirname "$0")/.."
test_name=${SIM_CANARY_TEST:-the_simulator_catches_a_disabled_fencing_check_within_the_seed_budget}
log="$(mktemp "${TMPDIR:-/tmp}/sim-canary.XXXXXX")"
trap 'rm -f "$log"' EXIT
cargo test -p sim --features canary --test canary -- --exact "$test_name" --nocapture 2>&1 | tee "$log"
# Only the summary line is matched: with --nocapture the test's own output can share the line
# of its "test NAME ..." header.
if ! grep -Eq '^test result: ok\. 1 passed' "$log"; then
  echo "sim canary: the canary test did not run (no 'test result: ok. 1 passed')" >&2
  exit 1
fi
