#!/usr/bin/env bash
# Builds benches/etcdelection/main.go (etcd's concurrency.Election, for
# benches/versus_etcd_election.rs) against the clientv3 3.4 client of
# Debian's golang-etcd-server-dev (3.4.23, the sources of the etcd-server
# the tests run, with the Go libraries it depends on, all under
# /usr/share/gocode), offline: Debian's Go, GOPATH mode, no module proxy.
# Installs the package with apt when it is missing (as
# scripts/etcd-testenv.sh installs etcd-server). Prints the binary's path.
#
# Everything lives in $BATON_CACHE/etcd/etcd-elector:
#   gopath/src/baton-etcd-elector/main.go   the program, in a GOPATH of its
#            own placed before /usr/share/gocode
#   gocache/ Go's build cache (a rebuild after a change takes seconds)
#   etcd-elector, etcd-elector.recipe
#            the binary, and the hash of what it was built from: it is
#            rebuilt only when main.go, this script or the package change.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
. "$repo/scripts/env.sh"
dir="$BATON_CACHE/etcd/etcd-elector"
bin="$dir/etcd-elector"
gocode=/usr/share/gocode
log() { echo "etcdelection/build.sh: $*" >&2; }
die() { echo "etcdelection/build.sh: error: $*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        die "needs root for: $*"
    fi
}
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

missing=()
for p in golang-go golang-etcd-server-dev; do
    installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    mkdir -p "$BATON_CACHE/etcd"
    exec 8>"$BATON_CACHE/etcd/.install.lock"
    flock 8
    log "installing ${missing[*]}"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
        as_root apt-get update -q >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    fi
    exec 8>&-
fi
[ -f "$gocode/src/go.etcd.io/etcd/clientv3/concurrency/election.go" ] ||
    die "no clientv3/concurrency in $gocode (golang-etcd-server-dev installed?)"
version="$(dpkg-query -W -f='${Version}' golang-etcd-server-dev)"

recipe="$( (sha256sum "$here/main.go" "$here/build.sh"; echo "$version") | sha256sum | cut -c1-16)"
if [ -x "$bin" ] && [ "$(cat "$bin.recipe" 2>/dev/null)" = "$recipe" ]; then
    echo "$bin"
    exit 0
fi
mkdir -p "$dir/gopath/src/baton-etcd-elector"
cp "$here/main.go" "$dir/gopath/src/baton-etcd-elector/main.go"
log "building etcd-elector (clientv3 of golang-etcd-server-dev $version, offline; a minute or two the first time)"
(
    # GOPATH mode: Debian's Go libraries are a GOPATH tree, one version of
    # each, with no go.mod to tidy; the program's own GOPATH comes first.
    export PATH="/usr/lib/go/bin:/usr/bin:/bin" GOCACHE="$dir/gocache" GOPATH="$dir/gopath:$gocode" \
        GO111MODULE=off GOPROXY=off GOFLAGS= CGO_ENABLED=0
    unset GOROOT
    cd "$dir/gopath/src/baton-etcd-elector"
    go build -trimpath -o "$bin.tmp" baton-etcd-elector
) || die "go build failed"
mv "$bin.tmp" "$bin"
echo "$recipe" >"$bin.recipe"
echo "$bin"
