#!/usr/bin/env bash
# Proves the simulator has teeth, three times, each in a build of its own:
# * feature `canary` (the provider's sim-canary) removes one fencing check; the invariants
#   must find a failing seed within the budget;
# * feature `recovery-canary` (the provider's sim-recovery-canary) disables automatic recovery
#   of fenced environments; the liveness phase must find a seed that leaves one fenced;
# * feature `supervisor-canary` (the provider's sim-supervisor-canary) disables the
#   supervisor's kill of a claim's commands at the claim's deadline; the checker's "no command
#   outlives its claim" must catch the detached-command race.
# CI calls this after the workspace tests.
#
# It fails unless each canary test actually ran and passed: a build in which a test compiled
# away (the feature not applied) or a filter that matched nothing runs no test, and cargo
# reports that as a success.
set -euo pipefail
cd "$(dirname "$0")/.."
log="$(mktemp "${TMPDIR:-/tmp}/sim-canary.XXXXXX")"
trap 'rm -f "$log"' EXIT

# canary FEATURE TEST_BINARY TEST_NAME
canary() {
  local feature=$1 binary=$2 name=$3
  cargo test -p sim --features "$feature" --test "$binary" -- --exact "$name" --nocapture 2>&1 | tee "$log"
  # Only the summary line is matched: with --nocapture the test's own output can share the
  # line of its "test NAME ..." header.
  if ! grep -Eq '^test result: ok\. 1 passed' "$log"; then
    echo "sim canary: the $feature test $name did not run (no 'test result: ok. 1 passed')" >&2
    exit 1
  fi
}

canary canary canary \
  "${SIM_CANARY_TEST:-the_simulator_catches_a_disabled_fencing_check_within_the_seed_budget}"
canary recovery-canary recovery_canary \
  "${SIM_RECOVERY_CANARY_TEST:-the_simulator_catches_a_disabled_automatic_recovery_within_the_seed_budget}"
canary supervisor-canary canary \
  "${SIM_SUPERVISOR_CANARY_TEST:-the_simulator_catches_a_disabled_supervisor_deadline_kill_within_the_seed_budget}"
