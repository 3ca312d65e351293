#!/usr/bin/env bash
# Benchmarks: builds the guests (Rust, and the other languages' for
# term_start), then runs every benchmark, which prints its
# figures (min / median / max over runs). BATON_BENCH_RUNS sets the runs;
# BATON_BENCH_PROFILE=release measures a release build of the host.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"
cd "$repo"
scripts/build-guests.sh >/dev/null
export BATON_GUESTS_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/release"
# The other languages' guests, for term_start (toolchains cached as for the
# tests).
export BATON_POLYGLOT_DIR="${BATON_POLYGLOT_DIR:-$BATON_CACHE/polyglot}"
scripts/build-polyglot-guests.sh >/dev/null
# By default the dev profile (dependencies optimised, see Cargo.toml), which
# shares the test build; a release build of wasmtime takes ten minutes or
# more on two cores the first time.
cargo bench --profile "${BATON_BENCH_PROFILE:-dev}" -p baton "$@"
