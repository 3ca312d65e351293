#!/usr/bin/env bash
# Prints the path of a working promtool (Prometheus's rule checker, for the
# test of deploy/prometheus/baton-rules.yaml), getting it first if needed:
#
#   scripts/promtool.sh    # -> /usr/bin/promtool, or $BATON_CACHE/promtool/promtool
#
# In order: $BATON_PROMTOOL, `promtool` on PATH, the cached copy, else
# Debian's `prometheus` package is downloaded (`apt-get download`, no root)
# and only its promtool unpacked into $BATON_CACHE/promtool. The package is
# not installed: installing it would start a Prometheus server as a service
# (its postinst enables and starts it), which the tests do not want beside
# them. `apt-get update` (root, or password-less sudo) only when the package
# lists do not know the package.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"

log() { echo "promtool: $*" >&2; }
die() { echo "promtool: error: $*" >&2; exit 1; }
works() { [ -n "$1" ] && "$1" --version >/dev/null 2>&1; }

if [ -n "${BATON_PROMTOOL:-}" ]; then
    works "$BATON_PROMTOOL" || die "BATON_PROMTOOL=$BATON_PROMTOOL does not run"
    echo "$BATON_PROMTOOL"
    exit 0
fi
p="$(command -v promtool || true)"
if works "$p"; then echo "$p"; exit 0; fi
dir="$BATON_CACHE/promtool"
if works "$dir/promtool"; then echo "$dir/promtool"; exit 0; fi

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        die "need root (or sudo) to run: $*"
    fi
}
policy="$(apt-cache policy prometheus 2>/dev/null || true)"
if ! grep -q 'Candidate: [0-9]' <<<"$policy"; then
    log "apt-get update (the package lists do not know prometheus)"
    as_root apt-get -o DPkg::Lock::Timeout=300 update -qq >&2
fi
mkdir -p "$dir"
work="$(mktemp -d "$dir/.unpack.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log "apt-get download prometheus (Debian's; only its promtool is kept)"
# As root, apt's sandbox user could not write into a cache under /root.
sandbox=()
[ "$(id -u)" -ne 0 ] || sandbox=(-o APT::Sandbox::User=root)
(cd "$work" && apt-get "${sandbox[@]}" download -qq prometheus >&2) || die "cannot download Debian's prometheus package"
deb="$(ls "$work"/prometheus_*.deb | head -n1)"
dpkg-deb -x "$deb" "$work/x"
[ -x "$work/x/usr/bin/promtool" ] || die "$deb holds no usr/bin/promtool"
cp "$work/x/usr/bin/promtool" "$dir/promtool.tmp"
mv "$dir/promtool.tmp" "$dir/promtool"
works "$dir/promtool" || die "$dir/promtool does not run"
log "$("$dir/promtool" --version 2>&1 | head -n1)"
echo "$dir/promtool"
