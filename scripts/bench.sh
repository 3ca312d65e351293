#!/usr/bin/env bash
# Benchmarks: builds the guests (Rust, and the other languages' for
# term_start), then runs the benchmarks, each of which prints its
# figures (min / median / max over runs). BATON_BENCH_RUNS sets the runs;
# BATON_BENCH_PROFILE=release measures a release build of the host.
#
# The long benches, on a Kubernetes API server or an etcd cluster of their
# own (versus_client_go, about 13 minutes; versus_etcd_election, about 25;
# requests_per_lease, about 9; api_capacity, about 10), or on a PostgreSQL
# of its own (versus_advisory_lock, about 8), run
# only with BATON_BENCH_LONG=1 or when named: scripts/bench.sh --bench
# requests_per_lease. They need the test servers installed
# (scripts/kube-testenv.sh install, scripts/etcd-testenv.sh install). Some benches have sweeps of their own
# (BATON_BENCH_SWEEP=1 for many_plugins); see docs/performance.md.
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
long="versus_client_go versus_etcd_election requests_per_lease api_capacity versus_advisory_lock"
named=0
for arg in "$@"; do
    case "$arg" in --bench | --bench=* | --benches) named=1 ;; esac
done
if [ "$named" = 0 ] && [ "${BATON_BENCH_LONG:-0}" != 1 ]; then
    # Every bench of host/Cargo.toml but the long ones.
    short=()
    for b in $(sed -n '/^\[\[bench\]\]/{n;s/^name = "\(.*\)"/\1/p}' host/Cargo.toml); do
        case " $long " in *" $b "*) ;; *) short+=(--bench "$b") ;; esac
    done
    echo "bench.sh: ${short[*]} (the long ones, $long: BATON_BENCH_LONG=1)" >&2
    set -- "${short[@]}" "$@"
fi
# By default the dev profile (dependencies optimised, see Cargo.toml), which
# shares the test build's dependencies (the host crate is built again,
# without the suite's test hooks); a release build of wasmtime takes ten
# minutes or more on two cores the first time.
cargo bench --profile "${BATON_BENCH_PROFILE:-dev}" -p baton "$@"
