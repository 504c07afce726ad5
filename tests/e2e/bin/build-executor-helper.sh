#!/usr/bin/env bash
# Builds the released execution-helper as the executor image carries it: the release profile,
# the gnu target with crt-static (statically linked against glibc; no musl target is installed
# on this project's machines), checked to have no dynamic loader. Prints the binary's path, for
# E2E_NODE_HELPER (start-node.sh) and kind/executor.Dockerfile's equivalent step.
#
# usage: build-executor-helper.sh   (in $CARGO_TARGET_DIR, else target/)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
target=x86_64-unknown-linux-gnu
# RUSTFLAGS with an explicit --target apply to the target only: build scripts and proc macros
# stay dynamic host binaries.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  cargo build --manifest-path "$repo/Cargo.toml" --release --locked --target "$target" --bin execution-helper >&2
bin="${CARGO_TARGET_DIR:-$repo/target}/$target/release/execution-helper"
linkage=$(ldd "$bin" 2>&1 || true)
grep -qE 'not a dynamic executable|statically linked' <<<"$linkage" || { echo "$bin is dynamically linked: $linkage" >&2; exit 1; }
echo "$bin"
