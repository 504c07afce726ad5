#!/usr/bin/env bash
# CI's mutation step (docs/testing.md, "Mutation testing"): one rotating shard of one area's
# mutants, within a fixed wall-time budget, against that area's tests (mutants/run.sh).
#
# The shard is chosen from the commit being tested, so successive submissions walk through
# every area's mutants. When the budget runs out the shard simply ends there (the mutants
# already judged count); what fails the step is a mutant the tests missed that is not listed,
# with its reason, in mutants/allow-list.txt.
#
# Environment: MUTANTS_BUDGET (seconds for the mutants, default 420), MUTANTS_SHARD_SIZE
# (mutants per shard, default 3), MUTANTS_UNIT (force one shard number instead of the one the
# commit picks), MUTANTS_TEST_TIMEOUT (seconds per mutant's test run, default 60).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/execution-provider"
VERSION=27.1.0
BUDGET="${MUTANTS_BUDGET:-420}"
SHARD_SIZE="${MUTANTS_SHARD_SIZE:-3}"
TEST_TIMEOUT="${MUTANTS_TEST_TIMEOUT:-60}"

# cargo-mutants is built from crates.io once per version and kept in the cache.
tool_root="$CACHE/cargo-mutants-$VERSION"
if ! "$tool_root/bin/cargo-mutants" mutants --version 2>/dev/null | grep -qx "cargo-mutants $VERSION"; then
  env -u CARGO_TARGET_DIR cargo install cargo-mutants --locked --version "$VERSION" \
    --root "$tool_root"
fi
export PATH="$tool_root/bin:$PATH"

out="$(mktemp -d "${TMPDIR:-/tmp}/execution-provider-mutants.XXXXXX")"
trap 'rm -rf "$out"' EXIT

# Every (area, shard) pair is one unit; the commit picks the unit.
units=()
for area in $(mutants/run.sh --areas); do
  count="$(MUTANTS_OUT="$out/list" mutants/run.sh "$area" --list | wc -l)"
  shards=$(((count + SHARD_SIZE - 1) / SHARD_SIZE))
  for ((k = 0; k < shards; k++)); do units+=("$area $k $shards"); done
done
if [[ -n "${MUTANTS_UNIT:-}" ]]; then
  unit=$((MUTANTS_UNIT % ${#units[@]}))
else
  commit="$(git rev-parse HEAD 2>/dev/null || date -u +%Y%m%d%H)"
  unit=$((16#$(printf '%s' "$commit" | sha256sum | cut -c1-12) % ${#units[@]}))
fi
read -r area k shards <<<"${units[$unit]}"
echo "mutation unit $unit of ${#units[@]}: area $area, shard $k/$shards, budget ${BUDGET}s"

# On a fresh machine the mutants' own target directory is empty: its dependencies are built
# here, outside the budget, once.
if [[ ! -d "${MUTANTS_TARGET_DIR:-$CACHE/mutants-target}/debug/deps" ]]; then
  nice -n 10 mutants/run.sh --warm "$area"
fi
# The workspace tests ran green just before this step, so the baseline is skipped. SIGINT
# lets cargo-mutants stop its build or test and keep the outcomes it has.
set +e
MUTANTS_OUT="$out" RUST_BACKTRACE=0 timeout -s INT -k 60 "$BUDGET" nice -n 10 mutants/run.sh "$area" \
  --shard "$k/$shards" --baseline=skip --timeout "$TEST_TIMEOUT" --build-timeout 900 \
  --no-times --colors=never
rc=$?
set -e
case "$rc" in
  0 | 2 | 3) ;;  # all caught, some missed, some timed out: judged below
  124 | 130 | 137 | 143) echo "the budget of ${BUDGET}s ended the shard; judging what ran" ;;
  *) echo "cargo-mutants failed (exit $rc)" >&2; exit 1 ;;
esac

exec mutants/gate.sh "$out/$area/mutants.out"
