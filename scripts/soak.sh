#!/usr/bin/env bash
# A chaos soak (tests/e2e/chaos.rs): three hosts, guests of both worlds that
# honour or ignore the change, and faults at random moments, in segments of
# 16 faults, until the results file holds FAULTS faults (default 500).
# Results go to $BATON_CACHE/soak/chaos.txt, one line per segment; run the
# same command again to resume a soak that stopped. Then sums the file up.
#
#   scripts/soak.sh [FAULTS]          run (or resume) and sum up
#   scripts/soak.sh --summary         sum up only
#   BATON_CHAOS_SEED=N scripts/soak.sh 16    replay one segment's faults
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"
cd "$repo"
results="${BATON_CHAOS_SOAK:-$BATON_CACHE/soak/chaos.txt}"
mkdir -p "$(dirname "$results")"

if [ "${1:-}" != "--summary" ]; then
    scripts/build-guests.sh >/dev/null
    export BATON_GUESTS_DIR="$CARGO_TARGET_DIR/wasm32-wasip2/release"
    BATON_CHAOS_FAULTS="${1:-500}" BATON_CHAOS_SOAK="$results" \
        cargo test -p baton --test e2e -- --nocapture --test-threads=1 chaos_on_the_embedded_store
fi

echo "== $results"
awk '
{
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        v[kv[1]] = kv[2]
    }
    segments++
    faults += v["faults"]; records += v["records"]; terms += v["terms"]
    overlaps += v["overlaps"]; stale += v["stale"]; late += v["late"]; crashes += v["crashes"]
    if (v["longest_gap_ms"] + 0 > gap) gap = v["longest_gap_ms"] + 0
    n = split(v["kinds"], kinds, ",")
    for (k = 1; k <= n; k++) { split(kinds[k], kn, ":"); count[kn[1]] += kn[2] }
}
END {
    printf "segments %d, faults %d, records %d, terms %d\n", segments, faults, records, terms
    printf "overlaps %d, stale records %d, records after their term ended %d, crashed hosts %d\n", overlaps, stale, late, crashes
    printf "longest time without records after a fault cleared: %d ms\n", gap
    for (k in count) printf "  %-16s %d\n", k, count[k]
}' "$results"
