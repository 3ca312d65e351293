#!/usr/bin/env bash
# A chaos soak (tests/e2e/chaos/engine.rs): three hosts, guests of both worlds
# that honour or ignore the change, and faults at random moments, in segments
# of 16 faults, until the results file holds FAULTS faults of each store.
# The embedded store's run uses the hosts' faults and the lease deleted or
# garbled; the Kubernetes store's run starts an API server and etcd of its own
# (scripts/kube-testenv.sh) and adds their faults (frozen, killed and
# restarted), the Lease deleted, a foreign writer and a black-holed host.
# The spread scenario (tests/e2e/chaos/layout.rs) runs three to five leases
# with spreading on, hosts watching their configuration file, and adds the
# faults that rewrite it (a plugin moved, a lease added, a lease removed, the
# timings changed) and `baton yield`; its figures are under store=NAME/spread.
# Results go to $BATON_CACHE/soak/chaos.txt, one line per segment; run the
# same command again to resume a soak that stopped. Then sums the file up,
# per store.
#
#   scripts/soak.sh [FAULTS] [STORE] [SCENARIO]
#                                     run (or resume) and sum up; FAULTS per
#                                     store and scenario (default 500), STORE
#                                     embedded, kubernetes or both (default),
#                                     SCENARIO one (one lease), spread or both
#                                     (default)
#   scripts/soak.sh --summary         sum up only
#   BATON_CHAOS_SEED=N scripts/soak.sh 16 kubernetes   replay one segment's faults
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"
cd "$repo"
results="${BATON_CHAOS_SOAK:-$BATON_CACHE/soak/chaos.txt}"
mkdir -p "$(dirname "$results")"

if [ "${1:-}" != "--summary" ]; then
    faults="${1:-500}" store="${2:-both}" scenario="${3:-both}"
    case "$store" in embedded | kubernetes | both) ;; *)
        echo "soak: unknown store $store (embedded, kubernetes or both)" >&2
        exit 2
        ;;
    esac
    case "$scenario" in one) tests=(never_overlaps) ;; spread) tests=(with_spread) ;; both) tests=(never_overlaps with_spread) ;; *)
        echo "soak: unknown scenario $scenario (one, spread or both)" >&2
        exit 2
        ;;
    esac
    scripts/build-guests.sh >/dev/null
    export BATON_GUESTS_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/release"
    export BATON_CHAOS_FAULTS="$faults" BATON_CHAOS_SOAK="$results"
    # With the test suite's features (scripts/test.sh), to reuse its build.
    for t in "${tests[@]}"; do
        if [ "$store" != kubernetes ]; then
            cargo test -p baton --features test-hooks --test e2e -- --nocapture --test-threads=1 "chaos_on_the_embedded_store_$t"
        fi
        if [ "$store" != embedded ]; then
            scripts/kube-testenv.sh install
            cargo test -p baton --features test-hooks --test kube -- --nocapture --test-threads=1 "chaos_on_the_kubernetes_store_$t"
        fi
    done
fi

echo "== $results"
awk '
{
    delete v
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        v[kv[1]] = kv[2]
    }
    s = v["store"]
    if (!(s in segments)) order[++stores] = s
    segments[s]++
    faults[s] += v["faults"]; records[s] += v["records"]; terms[s] += v["terms"]; handovers[s] += v["handovers"]
    overlaps[s] += v["overlaps"]; stale[s] += v["stale"]; late[s] += v["late"]; crashes[s] += v["crashes"]
    if (v["longest_gap_ms"] + 0 > gap[s]) gap[s] = v["longest_gap_ms"] + 0
    n = split(v["kinds"], kinds, ",")
    for (k = 1; k <= n; k++) { split(kinds[k], kn, ":"); count[s, kn[1]] += kn[2]; kind[kn[1]] = 1 }
}
END {
    for (i = 1; i <= stores; i++) {
        s = order[i]
        printf "-- %s store\n", s
        printf "segments %d, faults %d, records %d, terms %d, plugin hand-overs %d\n", segments[s], faults[s], records[s], terms[s], handovers[s]
        printf "overlaps %d, stale records %d, records after their term ended %d, crashed hosts %d\n", overlaps[s], stale[s], late[s], crashes[s]
        printf "longest time without records after a fault cleared: %d ms\n", gap[s]
        for (k in kind) if ((s, k) in count) printf "  %-16s %d\n", k, count[s, k]
    }
}' "$results"
