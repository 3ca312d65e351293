#!/usr/bin/env bash
# The main job: builds the example plugins and the host, then runs the host
# with examples/baton.toml on the embedded lease store until Ctrl-C.
# Run it in a second terminal too: the second host waits, and takes over
# within a second when you stop the first.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"
cd "$repo"

guests=$(scripts/build-guests.sh)
mkdir -p .baton/plugins
for name in rust_future_ticker rust_pollable_ticker; do
    cp "$(grep "/$name.wasm\$" <<<"$guests")" .baton/plugins/
done
scripts/build-tools.sh
# The host as shipped, without the test suite's hooks (host/Cargo.toml's
# `test-hooks`): after the suite, this compiles tokio and what is above it
# once more (cached after).
cargo build -p baton >&2
exec "$CARGO_TARGET_DIR/debug/baton" run --config examples/baton.toml "$@"
