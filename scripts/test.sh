#!/usr/bin/env bash
# The whole test suite: checks formatting and lints first, installs what it
# needs (the wasm32-wasip2 target), builds every guest component from
# source, then runs the host's unit tests, the end-to-end tests (real
# `baton` processes running real guests), the guest SDK's tests, and the
# container image's test.
#
# BATON_TEST_IMAGE=0 leaves the container image out (for a quicker local
# run; the suite is not whole then, and CI never sets it).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"
cd "$repo"

# One suite at a time per target directory, and never another clone's
# binaries: cargo names the workspace's own artefacts alike in every clone
# (their hashes count paths from the workspace root) and judges them fresh
# by mtime, so a clone whose files are older than what another clone built
# would run that clone's test binaries. When the last suite here ran from
# another clone, this clone's files are touched: the workspace's crates
# (not the dependencies) are rebuilt, a few minutes.
mkdir -p "$CARGO_TARGET_DIR"
exec 9>"$CARGO_TARGET_DIR/.baton-test.lock"
if ! flock -n 9; then
    echo "test: another suite uses $CARGO_TARGET_DIR; waiting for it" >&2
    flock 9
fi
if [ "$(cat "$CARGO_TARGET_DIR/.baton-clone" 2>/dev/null)" != "$repo" ]; then
    git ls-files -z | xargs -0 touch -c
    echo "$repo" >"$CARGO_TARGET_DIR/.baton-clone"
fi

# Every cargo command below builds the host with its test hooks
# (host/Cargo.toml's `test-hooks` feature: tests/core and the end-to-end
# tests that stall the election runtime need them), and so with one set of
# features: the lints, `cargo build` and `cargo test` share one build of
# tokio and of everything above it. A shipped build has no hooks
# (scripts/image.sh).
features=(--features test-hooks)

# The style gate, first, failing fast: formatting, then the lints of every
# host target (the workspace's lints are in Cargo.toml). Building needs
# protoc (scripts/build-tools.sh).
cargo fmt --all --check
scripts/build-tools.sh
cargo clippy -p baton --all-targets --locked "${features[@]}" -- -D warnings
# Where the set-up's time goes, on standard error.
phase() { echo "test: $1 by ${SECONDS} s" >&2; }
phase "style gate"

scripts/build-guests.sh >/dev/null
phase "guests built"
export BATON_GUESTS_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/release"
export BATON_POLYGLOT_DIR="${BATON_POLYGLOT_DIR:-$BATON_CACHE/polyglot}"
scripts/build-polyglot-guests.sh >/dev/null
phase "polyglot guests built"
# The container image (scripts/image.sh) is built beside the steps below, in
# the background: its static release build for the musl target compiles
# wasmtime once more (about 20 minutes on a cold 2-core machine, cached in
# the target directory after; a change to the host rebuilds the host crate
# alone, a few minutes), and beside the other builds it fills the time they
# leave a core idle (one crate compiling alone, linking, downloads). Cargo
# locks the dev profile's directory apart from the release ones, so the dev
# and the musl release builds run at once; a release build for the host
# (the guests' proc macros, `cargo install` of the guest toolchains) would
# wait for the musl one, so those are done above first. Its installs
# (apt-get) run first, so that no two apt-get run at once; the tests wait
# for the build to end (a build beside them would steal the CPU of tests
# that time reactions in milliseconds).
# Its own session (setsid), so that an early exit stops the whole build.
image=
cleanup() {
    if [ -n "$image" ]; then kill -- "-$image" 2>/dev/null || true; fi
    if [ -n "${kube:-}" ]; then
        scripts/kube-testenv.sh stop
        BATON_KUBE_ENV="$kube_terms_env" scripts/kube-testenv.sh stop || true
    fi
    if [ -n "${registries:-}" ]; then scripts/registry-testenv.sh stop; fi
    if [ -n "${etcd:-}" ]; then scripts/etcd-testenv.sh stop || true; fi
    if [ -n "${postgres:-}" ]; then scripts/pg-testenv.sh stop || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# promtool, for the alerting rules' test (tests/e2e/alerts.rs): Debian's,
# fetched once into the cache (its apt-get, if any, before the image's).
BATON_PROMTOOL="$(scripts/promtool.sh)"
export BATON_PROMTOOL
if [ "${BATON_TEST_IMAGE:-1}" != 0 ]; then
    scripts/image.sh --install-only
    image_log="$BATON_CACHE/image/build-$$.log"
    mkdir -p "$(dirname "$image_log")"
    setsid scripts/image.sh >"$image_log.out" 2>"$image_log" &
    image=$!
fi
# A real Kubernetes API server on loopback (scripts/kube-testenv.sh: built and
# cached on first use), for the kubernetes store's tests (the KUBE_TEST_*
# variables) and the deploy manifests' check; stopped on exit.
export BATON_KUBE_ENV="$BATON_CACHE/kube/run/test-$$.env"
# A second one for the kubeterms group (see the groups below).
kube_terms_env="$BATON_CACHE/kube/run/test-$$-terms.env"
kube=1
scripts/kube-testenv.sh start >/dev/null
BATON_KUBE_ENV="$kube_terms_env" scripts/kube-testenv.sh start >/dev/null
. "$BATON_KUBE_ENV"
deploy/kubernetes/verify.sh
# Real OCI registries on loopback (scripts/registry-testenv.sh: Debian's
# docker-registry, plain, with basic authentication, and over TLS), for
# the plugins pulled from registries (tests/e2e/registry.rs); stopped on exit.
export BATON_REGISTRY_ENV="$BATON_CACHE/registry/run/test-$$.env"
registries=1
eval "$(scripts/registry-testenv.sh start)"
# A 3-member etcd cluster on loopback (scripts/etcd-testenv.sh: Debian's
# etcd-server), for the etcd store's tests (tests/etcd); stopped on exit.
export BATON_ETCD_ENV="$BATON_CACHE/etcd/run/test-$$.env"
etcd=1
scripts/etcd-testenv.sh start >/dev/null
# A PostgreSQL 15 primary, its asynchronous standby and pgbouncer on
# loopback (scripts/pg-testenv.sh: Debian's postgresql-15, run as the
# postgres user), for the postgres store's tests (tests/postgres); stopped
# on exit.
export BATON_PG_ENV="$BATON_CACHE/postgres/run/test-$$.env"
postgres=1
scripts/pg-testenv.sh start >/dev/null
phase "servers started"
cargo build -p baton "${features[@]}"
phase "host built"
# The host and the SDK are tested in two runs: together, the SDK's
# wit-bindgen would change the features of crates that wasmtime's macros
# share, and wasmtime would be compiled a second time.
# Build every test binary first, then write the build's output to disk
# (sync): the tests time fsyncs of lease files in milliseconds, and a
# build leaves gigabytes of dirty pages, and in the first tests after one
# the lease files' fsyncs took over 200 ms each for more than a second.
cargo test --no-run -p baton "${features[@]}" "$@"
phase "tests built"
if [ -n "$image" ]; then
    if ! wait "$image"; then
        echo "test: building the container image failed (scripts/image.sh):" >&2
        tail -n 40 "$image_log" >&2
        exit 1
    fi
    image=
    phase "image built"
    archive="$(cat "$image_log.out")"
    tail -n 1 "$image_log" >&2
    rm -f "$image_log" "$image_log.out"
fi
sync
# The doc tests first; then the groups (the host's unit tests, the core
# tests, and the slow ones, with real processes: tests/e2e, its chaos
# segments, tests/kube, tests/polyglot, and the image test) at once, each one test
# at a time, so that one test's busy guests do not steal the CPU of
# another in the same group. They
# mostly wait (leases expiring, hand-overs): run one after another they
# left the CPU about 85 % idle. Each group's output goes to a log, printed
# whole when the group ends. BATON_TEST_SERIAL=1 runs the groups one after
# another instead (to tell contention apart from a real failure).
# --nocapture: the tests print their measured figures (hand-over times,
# stop latencies, request counts); the hosts' own logs stay captured.
status=0
cargo test -p baton --doc "${features[@]}" "$@" || status=1
# Each group: a test binary and its filter, split so that no group runs
# much longer than the others: the longest sets the suite's time (`test:
# the groups took ...` at the end says each one's). Measured alone, one
# test at a time (2026-12-05): tests/e2e 341 s, split into e2e (about
# 190 s) and state (state, schedules, alerts, health checks, drains,
# placement, addresses, registries and reloads: about 150 s); tests/kube
# 273 s, split into kube (elections, spreading, the store: about 130 s)
# and kubeterms (terms, foreign writers, outages, plugins, state, resets:
# about 140 s), which has an API server of its own: both count requests
# to theirs. The chaos segments (about a minute each store) have
# processes of their own. tests/etcd's faults and chaos segments (about
# two minutes), on clusters of their own, run apart from its other tests,
# which share the test cluster; so do tests/postgres's (pgfaults, about
# three minutes, on servers of their own). The host's unit tests and the in-process core
# tests (under a minute, paused time mostly) run beside them too.
groups=(unit core e2e state chaos kube kubeterms kubechaos etcd etcdfaults postgres pgfaults polyglot templates)
declare -A binary=([unit]=baton [core]=core [e2e]=e2e [state]=e2e [chaos]=e2e [kube]=kube [kubeterms]=kube [kubechaos]=kube [etcd]=etcd [etcdfaults]=etcd [postgres]=postgres [pgfaults]=postgres [polyglot]=polyglot [templates]=polyglot)
leader_tests="state:: schedules:: alerts:: health:: registry:: reload:: drain prefer_and_avoid weights_decide leases_and_status_name"
kube_terms="terms:: foreign:: outages:: plugins:: state:: reset::"
# The embedded store's paused leaders (a minute) run with its chaos
# segments, which they resemble. (Not the Kubernetes ones: they share the
# test API server with the kube group, whose request counts they disturb;
# the chaos segments have servers of their own.)
paused="a_leader_paused_past_its_lease_never_appends"
# tests/polyglot's builds and compilations: the templates (`baton new`)
# and a compile with an empty cache.
compiling="baton_new_ a_big_plugin_says_it_is_compiling"
declare -A filter=(
    [e2e]="--skip chaos:: --skip $paused $(printf -- '--skip %s ' $leader_tests)"
    [state]="$leader_tests"
    [chaos]="chaos:: $paused"
    [kube]="--skip chaos:: $(printf -- '--skip %s ' $kube_terms)"
    [kubeterms]="$kube_terms"
    [kubechaos]="chaos::"
    [polyglot]="$(printf -- '--skip %s ' $compiling)"
    [templates]="$compiling"
    [unit]=""
    [core]=""
    [etcd]="--skip faults:: --skip chaos::"
    [etcdfaults]="faults:: chaos::"
    [postgres]="--skip faults:: --skip chaos::"
    [pgfaults]="faults:: chaos::"
)
declare -A bin
while IFS=' ' read -r name path; do bin[$name]="$path"; done < <(
    cargo test --no-run -p baton "${features[@]}" "$@" --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] in (["test"], ["lib"]):
        print(m["target"]["name"], m["executable"])')
logs="$(mktemp -d)"
echo "test: built and set up in ${SECONDS} s; the groups start" >&2
groups_start=$SECONDS
declare -A pid
for g in "${groups[@]}"; do
    exe="${bin[${binary[$g]}]:-}"
    [ -n "$exe" ] || { echo "test: no test binary for tests/${binary[$g]}" >&2; exit 1; }
    (
        cd host
        if [ "$g" = kubeterms ]; then
            export BATON_KUBE_ENV="$kube_terms_env"
            . "$BATON_KUBE_ENV"
        fi
        rc=0
        # shellcheck disable=SC2086 # the filter is words
        "$exe" --test-threads=1 --nocapture ${filter[$g]} || rc=$?
        echo "$rc" >"$logs/$g.rc"
        echo "$SECONDS" >"$logs/$g.secs"
    ) >"$logs/$g.log" 2>&1 &
    pid[$g]=$!
    if [ "${BATON_TEST_SERIAL:-0}" = 1 ]; then wait "${pid[$g]}"; fi
done
# The container image, built above: scripts/image-test.sh runs it against an
# API server of its own, beside a host outside the image; beside the groups.
if [ -n "${archive:-}" ]; then
    groups+=(image)
    (
        rc=0
        BATON_KUBE_ENV="$BATON_CACHE/kube/run/test-image-$$.env" scripts/image-test.sh "$archive" || rc=$?
        echo "$rc" >"$logs/image.rc"
        echo "$SECONDS" >"$logs/image.secs"
    ) >"$logs/image.log" 2>&1 &
    pid[image]=$!
fi
for g in "${groups[@]}"; do
    wait "${pid[$g]}" 2>/dev/null || true
    echo "==== $g"
    cat "$logs/$g.log"
    took="$(( $(cat "$logs/$g.secs" 2>/dev/null || echo "$SECONDS") - groups_start ))"
    times="${times:-}$g ${took} s, "
    if [ "$(cat "$logs/$g.rc" 2>/dev/null)" != 0 ]; then
        status=1
        failed="${failed:-} $g"
    fi
done
# The failures again, last, where a reader of a long log looks: each
# panic's message (without its backtrace) and each group's list.
for g in ${failed:-}; do
    echo "==== failures in $g"
    awk '/ panicked at /      { n = 12 }
         /^stack backtrace:/ { n = 0 }
         n > 0               { print; n-- }
         /^failures:$/       { list = 1 }
         list                { print }
         /^test result:/     { list = 0 }' "$logs/$g.log"
done
rm -rf "$logs"
echo "test: the groups took ${times%, } (their longest sets the suite's time)" >&2
cargo test -p baton-guest --all-features "$@" -- --test-threads=1 || status=1
echo "test: ${SECONDS} s in all" >&2
if [ "$status" != 0 ]; then
    echo "test: failed:${failed:- (see above)}" >&2
fi
exit "$status"
