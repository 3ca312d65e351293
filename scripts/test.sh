#!/usr/bin/env bash
# The whole test suite: installs what it needs (the wasm32-wasip2 target),
# builds every guest component from source, then runs the host's unit tests,
# the end-to-end tests (real `baton` processes running real guests) and the
# guest SDK's tests.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"
cd "$repo"

scripts/build-guests.sh >/dev/null
export BATON_GUESTS_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/release"
cargo build -p baton
# The end-to-end tests time reactions in milliseconds: run test binaries one
# test at a time, so that one test's busy guests do not steal the CPU of another.
cargo test -p baton -p baton-guest "$@" -- --test-threads=1
