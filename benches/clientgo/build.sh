#!/usr/bin/env bash
# Builds benches/clientgo/main.go (client-go's leader election, for
# benches/versus_client_go.rs) against client-go 1.20.2 from the Kubernetes
# source tarball that scripts/kube-testenv.sh downloaded, offline: Debian's
# Go, the tree's own vendored modules (client-go from staging/), no module
# proxy. Prints the binary's path.
#
# Everything lives in $BATON_CACHE/kube/clientgo-elector:
#   tree/    go.mod, go.sum, vendor/ and staging/ of the tarball (~200 MB),
#            with main.go as tree/cmd/baton-clientgo-elector
#   gocache/ Go's build cache (a rebuild after a change takes seconds)
#   clientgo-elector, clientgo-elector.recipe
#            the binary, and the hash of what it was built from: it is
#            rebuilt only when main.go, this script or the tarball change.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
. "$repo/scripts/env.sh"
kube="$BATON_CACHE/kube"
dir="$kube/clientgo-elector"
bin="$dir/clientgo-elector"
log() { echo "clientgo/build.sh: $*" >&2; }
die() { echo "clientgo/build.sh: error: $*" >&2; exit 1; }

tarball="$(ls "$kube"/src/kubernetes_*.orig.tar.* 2>/dev/null | head -n1 || true)"
[ -n "$tarball" ] || die "no Kubernetes source tarball in $kube/src: run scripts/kube-testenv.sh install first"
recipe="$( (sha256sum "$here/main.go" "$here/build.sh"; basename "$tarball") | sha256sum | cut -c1-16)"
if [ -x "$bin" ] && [ "$(cat "$bin.recipe" 2>/dev/null)" = "$recipe" ]; then
    echo "$bin"
    exit 0
fi
mkdir -p "$dir"
tree="$dir/tree"
if [ ! -f "$tree/.unpacked" ]; then
    log "unpacking go.mod, vendor/ and staging/ of $(basename "$tarball")"
    rm -rf "$tree" "$tree.tmp" && mkdir -p "$tree.tmp"
    top="$(tar -tzf "$tarball" 2>/dev/null | head -n1 | cut -d/ -f1 || true)"
    tar -xzf "$tarball" -C "$tree.tmp" "$top/go.mod" "$top/go.sum" "$top/vendor" "$top/staging"
    mv "$tree.tmp/$top" "$tree" && rmdir "$tree.tmp"
    # Kubernetes 1.20 vendors reflect2 v1.0.1, which breaks under Go 1.18
    # and later (json-iterator panics in reflect2.Type2); Debian's reflect2
    # v1.0.2 replaces it, as scripts/kube-testenv.sh does for the API server.
    if grep -q '^# github.com/modern-go/reflect2 v1\.0\.1 ' "$tree/vendor/modules.txt"; then
        deb="$(ls "$kube"/src/golang-github-modern-go-reflect2-dev_*.deb 2>/dev/null | head -n1 || true)"
        [ -n "$deb" ] || die "no golang-github-modern-go-reflect2-dev .deb in $kube/src (scripts/kube-testenv.sh install downloads it)"
        x="$(mktemp -d)"
        dpkg-deb -x "$deb" "$x"
        src="$x/usr/share/gocode/src/github.com/modern-go/reflect2"
        [ -f "$src/go_above_118.go" ] || die "$deb does not hold reflect2 v1.0.2 or later"
        vend="$tree/vendor/github.com/modern-go/reflect2"
        rm -f "$vend"/*.go "$vend"/*.s
        cp "$src"/*.go "$src"/*.s "$vend/"
        rm -rf "$x"
    fi
    touch "$tree/.unpacked"
fi
mkdir -p "$tree/cmd/baton-clientgo-elector"
cp "$here/main.go" "$tree/cmd/baton-clientgo-elector/main.go"
log "building clientgo-elector (client-go $(basename "$tarball" | sed -E 's/^kubernetes_//; s/\.orig\.tar\..*$//; s/^.*really//'), vendored; a minute or two the first time)"
(
    # GOPATH mode, as Kubernetes 1.20's own build (and scripts/kube-testenv.sh):
    # the tree is k8s.io/kubernetes, whose vendor/ (client-go a link into
    # staging/) serves every import. Module mode would want go.mod tidied.
    export PATH="/usr/lib/go/bin:/usr/bin:/bin" GOCACHE="$dir/gocache" GOPATH="$dir/gopath" \
        GO111MODULE=off GOPROXY=off CGO_ENABLED=0
    unset GOROOT GOFLAGS
    mkdir -p "$GOPATH/src/k8s.io"
    ln -sfn "$tree" "$GOPATH/src/k8s.io/kubernetes"
    cd "$GOPATH/src/k8s.io/kubernetes"
    go build -trimpath -o "$bin.tmp" k8s.io/kubernetes/cmd/baton-clientgo-elector
) || die "go build failed"
mv "$bin.tmp" "$bin"
echo "$recipe" >"$bin.recipe"
echo "$bin"
