#!/usr/bin/env bash
# Bounded fuzzing with teeth (docs/testing.md, "Fuzzing"). Builds every cargo-fuzz target with
# libFuzzer coverage instrumentation, AddressSanitizer, debug assertions and overflow checks,
# then runs each for a bounded time from its committed inputs (fuzz/corpus/<target>/,
# fuzz/seeds/<target>/ and fuzz/regressions/<target>/). It fails on any crash, timeout or
# out-of-memory, printing the input that caused it, and also when a target did not run.
#
#   bash fuzz/run.sh [TARGET...]            the CI run: FUZZ_SECONDS per target (default 60)
#   bash fuzz/run.sh --refresh [TARGET...]  fuzz FUZZ_SECONDS per target (default 600), then
#                                           minimise everything into fuzz/corpus/<target>/
#
# Environment: FUZZ_SECONDS; FUZZ_TIMEOUT (seconds one input may take, default 10);
# FUZZ_RSS_MB (memory limit, default 2048); FUZZ_TARGET_DIR (the build, cached outside the
# repository, default ~/.cache/execution-provider/fuzz-target); FUZZ_ARTIFACTS (where crashing
# inputs are written, default fuzz/artifacts, ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=run
if [[ "${1:-}" == "--refresh" ]]; then
  MODE=refresh
  shift
fi
if [[ $MODE == refresh ]]; then
  FUZZ_SECONDS="${FUZZ_SECONDS:-600}"
else
  FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
fi
FUZZ_TIMEOUT="${FUZZ_TIMEOUT:-10}"
FUZZ_RSS_MB="${FUZZ_RSS_MB:-2048}"
CORPUS_MAX_BYTES=$((1024 * 1024))
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/execution-provider"
FUZZ_TARGET_DIR="${FUZZ_TARGET_DIR:-$CACHE/fuzz-target}"
FUZZ_ARTIFACTS="${FUZZ_ARTIFACTS:-$PWD/fuzz/artifacts}"
export CARGO_INCREMENTAL=0

if [[ $# -gt 0 ]]; then
  TARGETS=("$@")
else
  TARGETS=()
  for source in fuzz/fuzz_targets/*.rs; do
    TARGETS+=("$(basename "$source" .rs)")
  done
fi
for target in "${TARGETS[@]}"; do
  if [[ ! -f "fuzz/fuzz_targets/$target.rs" ]]; then
    echo "error: no fuzz target $target (fuzz/fuzz_targets/$target.rs)" >&2
    exit 1
  fi
done

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "error: the nightly toolchain is missing: the fuzz targets need it" >&2
  exit 1
fi
HOST="$(rustup run nightly rustc -vV | sed -n 's/^host: //p')"

# cargo-fuzz passes the coverage and sanitizer flags that match the nightly compiler; it is
# built once per version into the cache (with the repository's pinned stable toolchain).
CARGO_FUZZ_VERSION=0.13.2
CARGO_FUZZ_ROOT="$CACHE/cargo-fuzz-$CARGO_FUZZ_VERSION"
if [[ ! -x "$CARGO_FUZZ_ROOT/bin/cargo-fuzz" ]]; then
  echo "-- installing cargo-fuzz $CARGO_FUZZ_VERSION into $CARGO_FUZZ_ROOT (once)"
  env -u CARGO_TARGET_DIR cargo install cargo-fuzz --version "=$CARGO_FUZZ_VERSION" --locked \
    --root "$CARGO_FUZZ_ROOT"
fi
export PATH="$CARGO_FUZZ_ROOT/bin:$PATH"

echo "-- building the fuzz targets into $FUZZ_TARGET_DIR"
cargo +nightly fuzz build --fuzz-dir fuzz --target "$HOST" --release --debug-assertions \
  --sanitizer address --codegen-units 16 --target-dir "$FUZZ_TARGET_DIR"
BIN_DIR="$FUZZ_TARGET_DIR/$HOST/release"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/execution-provider-fuzz.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# The bytes of all files in the given directories.
bytes_in() {
  find "$@" -type f -printf '%s\n' | awk '{ total += $1 } END { print total + 0 }'
}

# Prints what reproduces a failure of TARGET from its log: each input libFuzzer wrote, with
# its size, its bytes in base64 when short (so a CI log alone reproduces it) and the commands.
report_failure() {
  local target=$1 log=$2
  echo "error: fuzz target $target failed; the last lines of its output:"
  tail -n 40 "$log" | cut -c1-400
  local inputs
  inputs="$(grep -o 'Test unit written to .*' "$log" | sed 's/^Test unit written to //' || true)"
  if [[ -z $inputs ]]; then
    echo "error: fuzz target $target failed without writing an input (see its output above)"
    return
  fi
  while IFS= read -r input; do
    echo "error: fuzz target $target crashes on $input ($(wc -c <"$input") bytes)"
    if [[ $(wc -c <"$input") -le 4096 ]]; then
      echo "  base64: $(base64 -w0 "$input")"
    fi
    echo "  reproduce: $BIN_DIR/$target $input"
    echo "  keep it:   cp $input fuzz/regressions/$target/ && fix the bug (docs/testing.md)"
  done <<<"$inputs"
}

# Runs TARGET for FUZZ_SECONDS from its committed inputs, new interesting inputs going to
# $WORK/TARGET/new. Returns non-zero on a crash, a timeout, an OOM or a run that did not happen.
fuzz_target() {
  local target=$1
  local log="$WORK/$target.log" new="$WORK/$target/new"
  local inputs=()
  for dir in "fuzz/corpus/$target" "fuzz/seeds/$target" "fuzz/regressions/$target"; do
    if [[ -d $dir ]]; then
      inputs+=("$dir")
    fi
  done
  local committed=0
  if [[ ${#inputs[@]} -gt 0 ]]; then
    committed="$(find "${inputs[@]}" -type f | wc -l)"
  fi
  if [[ $committed -eq 0 ]]; then
    echo "error: fuzz target $target has no committed input (fuzz/corpus/$target/ is empty)"
    return 1
  fi
  local corpus_bytes=0
  if [[ -d "fuzz/corpus/$target" ]]; then
    corpus_bytes="$(bytes_in "fuzz/corpus/$target")"
  fi
  if [[ $corpus_bytes -gt $CORPUS_MAX_BYTES ]]; then
    echo "error: fuzz/corpus/$target holds $corpus_bytes bytes, more than $CORPUS_MAX_BYTES"
    return 1
  fi
  mkdir -p "$new" "$FUZZ_ARTIFACTS/$target" "$WORK/$target/tmp"
  echo "-- fuzzing $target for ${FUZZ_SECONDS}s from $committed committed inputs"
  local status=0
  TMPDIR="$WORK/$target/tmp" "$BIN_DIR/$target" -max_total_time="$FUZZ_SECONDS" \
    -timeout="$FUZZ_TIMEOUT" -rss_limit_mb="$FUZZ_RSS_MB" \
    -artifact_prefix="$FUZZ_ARTIFACTS/$target/" -print_final_stats=1 \
    "$new" "${inputs[@]}" >"$log" 2>&1 || status=$?
  if [[ $status -ne 0 ]] || grep -q 'Test unit written to' "$log"; then
    report_failure "$target" "$log"
    return 1
  fi
  # A run counts only when libFuzzer read the committed inputs, executed them and fuzzed.
  local loaded runs
  loaded="$(sed -n 's/^INFO: seed corpus: files: \([0-9]*\).*/\1/p' "$log" | head -n 1)"
  runs="$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\)$/\1/p' "$log" | tail -n 1)"
  if ! grep -q '^#[0-9]*[[:space:]]*INITED' "$log" || [[ -z $loaded || $loaded -eq 0 ]] ||
    [[ -z $runs || $runs -le $committed ]]; then
    echo "error: fuzz target $target did not run (loaded: ${loaded:-none}, executions: ${runs:-none}); its output:"
    tail -n 40 "$log" | cut -c1-400
    return 1
  fi
  echo "   $target: $runs executions in ${FUZZ_SECONDS}s from $loaded inputs," \
    "$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -n 1)," \
    "$(find "$new" -type f | wc -l) new inputs"
}

# Minimises everything known about TARGET (committed inputs and this run's new ones) into a
# fresh fuzz/corpus/TARGET/ with libFuzzer's -merge=1, within CORPUS_MAX_BYTES.
minimise_corpus() {
  local target=$1
  local merged="$WORK/$target/merged" sources=()
  for dir in "fuzz/corpus/$target" "fuzz/seeds/$target" "fuzz/regressions/$target" \
    "$WORK/$target/new"; do
    if [[ -d $dir ]]; then
      sources+=("$dir")
    fi
  done
  mkdir -p "$merged"
  TMPDIR="$WORK/$target/tmp" "$BIN_DIR/$target" -merge=1 -timeout="$FUZZ_TIMEOUT" \
    -rss_limit_mb="$FUZZ_RSS_MB" "$merged" "${sources[@]}" >"$WORK/$target.merge.log" 2>&1 || {
    echo "error: minimising the corpus of $target failed:"
    tail -n 20 "$WORK/$target.merge.log"
    return 1
  }
  local bytes
  bytes="$(bytes_in "$merged")"
  if [[ $bytes -gt $CORPUS_MAX_BYTES ]]; then
    echo "error: the minimised corpus of $target is $bytes bytes, more than $CORPUS_MAX_BYTES"
    return 1
  fi
  rm -rf "fuzz/corpus/$target"
  mkdir -p fuzz/corpus
  mv "$merged" "fuzz/corpus/$target"
  echo "   fuzz/corpus/$target: $(find "fuzz/corpus/$target" -type f | wc -l) inputs, $bytes bytes"
}

failed=()
for target in "${TARGETS[@]}"; do
  if ! fuzz_target "$target"; then
    failed+=("$target")
    continue
  fi
  if [[ $MODE == refresh ]] && ! minimise_corpus "$target"; then
    failed+=("$target")
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "error: fuzzing failed for: ${failed[*]}"
  exit 1
fi
echo "-- fuzzing passed: ${TARGETS[*]} (${FUZZ_SECONDS}s each)"
