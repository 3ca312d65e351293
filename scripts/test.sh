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
export BATON_POLYGLOT_DIR="${BATON_POLYGLOT_DIR:-$BATON_CACHE/polyglot}"
scripts/build-polyglot-guests.sh >/dev/null
# A real Kubernetes API server on loopback (scripts/kube-testenv.sh: built and
# cached on first use), for the kubernetes store's tests (the KUBE_TEST_*
# variables) and the deploy manifests' check; stopped on exit.
export BATON_KUBE_ENV="$BATON_CACHE/kube/run/test-$$.env"
trap 'scripts/kube-testenv.sh stop' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
scripts/kube-testenv.sh start >/dev/null
. "$BATON_KUBE_ENV"
deploy/kubernetes/verify.sh
cargo build -p baton
# The end-to-end tests time reactions in milliseconds: run test binaries one
# test at a time, so that one test's busy guests do not steal the CPU of another.
# --nocapture: the tests print their measured figures (hand-over times,
# stop latencies, request counts); the hosts' own logs stay captured.
# The host and the SDK are tested in two runs: together, the SDK's
# wit-bindgen would change the features of crates that wasmtime's macros
# share, and wasmtime would be compiled a second time.
# Build every test binary first, then write the build's output to disk
# (sync): the tests time fsyncs of lease files in milliseconds, and a
# build leaves gigabytes of dirty pages, and in the first tests after one
# the lease files' fsyncs took over 200 ms each for more than a second.
cargo test --no-run -p baton "$@"
sync
cargo test --no-fail-fast -p baton "$@" -- --test-threads=1 --nocapture
cargo test -p baton-guest --all-features "$@" -- --test-threads=1
# The container image, only when asked (BATON_TEST_IMAGE=1): its static build
# compiles wasmtime once more, for the musl target (about 20 minutes on a
# cold 2-core machine, cached in the target directory after), then
# scripts/image-test.sh runs it against an API server of its own.
if [ "${BATON_TEST_IMAGE:-}" = 1 ]; then
    archive="$(scripts/image.sh)"
    BATON_KUBE_ENV="$BATON_CACHE/kube/run/test-image-$$.env" scripts/image-test.sh "$archive"
fi
