#!/usr/bin/env bash
# Benchmarks: builds the guests, then runs every benchmark, which prints its
# figures (min / median / max over runs). BATON_BENCH_RUNS sets the runs.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"
cd "$repo"
scripts/build-guests.sh >/dev/null
export BATON_GUESTS_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/release"
# The dev profile (dependencies optimised, see Cargo.toml) shares the test
# build; a separate release build of wasmtime would take ten minutes here.
cargo bench --profile dev -p baton "$@"
