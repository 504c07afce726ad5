#!/usr/bin/env bash
# Stops exactly the processes start-control-plane.sh recorded in <work>/pids, newest first:
# SIGTERM, a deadline for each to exit, then SIGKILL. A PID whose process no longer runs the
# recorded binary (it exited and the number was reused) is left alone. It also removes the
# helper link the start script made.
#
# usage: stop-control-plane.sh [WORK]   (default $E2E_WORK or ${TMPDIR:-/tmp}/execution-provider-e2e)
set -uo pipefail
WORK="${1:-${E2E_WORK:-${TMPDIR:-/tmp}/execution-provider-e2e}}"
# The helper link start-control-plane.sh made, if it still points into this work directory.
if [[ -f "$WORK/helper-link" ]]; then
  link=$(cat "$WORK/helper-link")
  [[ "$(readlink "$link" 2>/dev/null)" == "$WORK/execution-helper-kwok" ]] && rm -f "$link"
  rm -f "$WORK/helper-link"
fi
[[ -d "$WORK/pids" ]] || exit 0
for f in $(ls -r "$WORK"/pids/*.pid 2>/dev/null); do
  pid=$(cat "$f")
  name=$(basename "$f" .pid); name=${name#*-}
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  if [[ -z "$exe" || "$(basename "$exe")" != "$name" ]]; then
    rm -f "$f"; continue
  fi
  kill -TERM "$pid" 2>/dev/null
  deadline=$((SECONDS + 15))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "$name ($pid) ignored SIGTERM for 15s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$f"
done
