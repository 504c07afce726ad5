#!/usr/bin/env bash
# Proves the simulator has teeth: builds the provider with one fencing check removed
# (feature sim-canary, via the sim crate's `canary` feature) and asserts that the simulator
# finds a failing seed within the budget. CI can call this after the workspace tests.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -p sim --features canary --test canary -- --nocapture
