#!/usr/bin/env bash
# Builds every Rust guest (plugin component) of this repository for
# wasm32-wasip2 in release mode and prints the paths of the .wasm files, one
# a line, on stdout (cargo's progress goes to stderr).
#
#   scripts/build-guests.sh            # all guests
#   CARGO_TARGET_DIR=/some/dir scripts/build-guests.sh
#
# The target dir defaults to $HOME/.cache/baton/target (shared with the
# host's builds). All guests are built in one cargo command, so that the
# `future` and `pollable` features of baton-guest are unified the same way
# every time (each component still targets only its own world) and a second
# run with nothing changed is a no-op.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/baton/target}"
target=wasm32-wasip2

# Package name -> .wasm file name (cargo turns '-' into '_' for libraries).
guests=(
    "rust-future-ticker:rust_future_ticker.wasm"
    "rust-pollable-ticker:rust_pollable_ticker.wasm"
    "rust-kv-counter:rust_kv_counter.wasm"
    "probe-future:probe_future.wasm"
    "probe-pollable:probe_pollable.wasm"
    "not-a-plugin:not-a-plugin.wasm"
    "missing-import:missing_import.wasm"
    "http-probe:http_probe.wasm"
    "hosts-pollable:hosts_pollable.wasm"
    "hosts-future:hosts_future.wasm"
    "kv-counter:kv_counter.wasm"
    "sched-probe:sched_probe.wasm"
    "health-probe:health_probe.wasm"
    "probe-v03:probe_v03.wasm"
)

# `rustup target add` is idempotent but slow-ish; skip it when the target's
# standard library is already there.
if ! rustc --print sysroot >/dev/null 2>&1 \
    || [ ! -d "$(rustc --print sysroot)/lib/rustlib/$target" ]; then
    rustup target add "$target" >&2
fi

args=()
for g in "${guests[@]}"; do
    args+=(-p "${g%%:*}")
done

cd "$repo"
cargo build --release --target "$target" "${args[@]}" >&2

out="$CARGO_TARGET_DIR/$target/release"
for g in "${guests[@]}"; do
    wasm="$out/${g#*:}"
    if [ ! -f "$wasm" ]; then
        echo "build-guests: expected $wasm, not found" >&2
        exit 1
    fi
    # A component, not a core module: the layer field (bytes 6..8) is 1.
    if [ "$(od -An -tx1 -j4 -N4 "$wasm" | tr -d ' \n')" != "0d000100" ]; then
        echo "build-guests: $wasm is not a WebAssembly component" >&2
        exit 1
    fi
    echo "$wasm"
done
