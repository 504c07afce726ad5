#!/usr/bin/env bash
# Builds the security fuzz targets with the machine's nightly and cargo-fuzz, then runs each
# for a bounded number of inputs from an empty corpus: a smoke check that they build and do
# not crash at once. Not part of .ci/run (a cold build takes about 20 minutes on 2 cores).
#   fuzz/smoke.sh [RUNS]        default RUNS=30000
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-30000}"
command -v cargo-fuzz >/dev/null || { echo "install cargo-fuzz: cargo install cargo-fuzz" >&2; exit 2; }
for target in grant_decode manifest_parse; do
  cargo +nightly fuzz build --fuzz-dir fuzz "$target"
  corpus="$(mktemp -d)"
  cargo +nightly fuzz run --fuzz-dir fuzz "$target" "$corpus" -- -runs="$runs"
  rm -rf "$corpus"
done
