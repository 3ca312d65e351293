#!/usr/bin/env bash
# Benchmarks: builds the guests, then runs every benchmark, which prints its
# figures (min / median / max over runs). BATON_BENCH_RUNS sets the runs;
# BATON_BENCH_PROFILE=release measures a release build of the host.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"
cd "$repo"
scripts/build-guests.sh >/dev/null
export BATON_GUESTS_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/release"
# By default the dev profile (dependencies optimised, see Cargo.toml), which
# shares the test build; a release build of wasmtime takes ten minutes or
# more on two cores the first time.
cargo bench --profile "${BATON_BENCH_PROFILE:-dev}" -p baton "$@"
