#!/usr/bin/env bash
# The long seed campaign: every scenario over SEEDS consecutive seeds (default 10000, from seed
# FIRST, default 1), with the simulator built once in the `sim` profile. Scenarios run JOBS at a
# time (default: the number of cores), each in its own process; each prints its `ok:` line (its
# simulated seconds and speed) or its `FAILED seed=N ... replay: <command>` line and stops at
# its first failing seed. The campaign fails if any scenario failed. The expected wall time is
# in docs/simulation.md ("Speed").
#
#   sim/campaign.sh                       # 10000 seeds of every scenario
#   SEEDS=500 FIRST=20001 sim/campaign.sh swarm stale-epoch
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${SEEDS:-10000}
first=${FIRST:-1}
jobs=${JOBS:-$(nproc)}
scenarios=("$@")
if [[ ${#scenarios[@]} -eq 0 ]]; then
  scenarios=(smoke failover stale-epoch revocation-race partition-heal crash-restart
    lifecycle-race capacity-race swarm)
fi
cargo build -p sim --profile sim
target_dir=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
sim="$target_dir/sim/sim"
logs="$(mktemp -d "${TMPDIR:-/tmp}/sim-campaign.XXXXXX")"
trap 'rm -rf "$logs"' EXIT
echo "campaign: ${#scenarios[@]} scenarios x $seeds seeds from seed $first, $jobs at a time"
printf '%s\n' "${scenarios[@]}" |
  xargs -P "$jobs" -I{} sh -c \
    '"$0" --scenario {} --seed "$1" --seeds "$2" > "$3/{}.log" 2>&1; echo "{}: $(tail -n 20 "$3/{}.log" | grep -E "^(ok|FAILED)" | head -n 1)"' \
    "$sim" "$first" "$seeds" "$logs" || true
failed=0
for scenario in "${scenarios[@]}"; do
  if ! grep -q '^ok: ' "$logs/$scenario.log"; then
    failed=1
    echo "== $scenario did not pass:"
    tail -n 20 "$logs/$scenario.log"
  fi
done
exit "$failed"
