#!/usr/bin/env bash
# A real Kubernetes API server for tests, on loopback: kube-apiserver v1.20.2
# built from Debian's own source package, on Debian's etcd-server.
#
#   scripts/kube-testenv.sh install   install the Debian packages, download and
#                                     build kube-apiserver (cached; seconds when done)
#   scripts/kube-testenv.sh start     install, then start etcd and kube-apiserver on
#                                     free loopback ports; prints `export ...` lines,
#                                     so `eval "$(scripts/kube-testenv.sh start)"` works
#   scripts/kube-testenv.sh stop      stop them (by their recorded process ids) and
#                                     delete their data, keys and tokens; safe to
#                                     call twice
#   scripts/kube-testenv.sh status    says whether they run (exit 0 if so, 1 if not)
#   scripts/kube-testenv.sh revive    starts again whichever of etcd and kube-apiserver
#                                     is no longer running (killed by a test), on the
#                                     same ports, data and keys, waits until the API
#                                     server is ready, and updates the env file's pids
#
# Everything downloaded or built lives in $BATON_CACHE/kube (scripts/env.sh),
# never in the clone:
#   src/   the source package (the build tree is deleted once the build succeeded)
#   bin/   kube-apiserver, and kubectl when it is unpacked from the .deb
#   run/   one folder per started server (its logs stay after `stop`, until the
#          next `start`), and the default env file
#
# `start` writes an env file ($BATON_KUBE_ENV, default $BATON_CACHE/kube/run/env.sh)
# that exports:
#   KUBE_TEST_SERVER          https://127.0.0.1:PORT
#   KUBE_TEST_CA              the API server's self-signed certificate
#   KUBE_TEST_ADMIN_TOKEN     bearer token of user admin (group system:masters)
#   KUBE_TEST_KUBECONFIG      kubeconfig of admin
#   KUBE_TEST_KUBECONFIG_DIR  folder of <user>.kubeconfig for baton-a, baton-b,
#                             baton-c and nobody (token users without groups or roles)
#   KUBE_TEST_APISERVER_PID, KUBE_TEST_ETCD_PID, KUBE_TEST_APISERVER_LOG
#   KUBE_TEST_ETCD_URL        http://127.0.0.1:PORT, etcd's client URL
#   KUBE_TEST_KUBECTL         kubectl 1.20 (Debian's kubernetes-client), or empty
# One env file describes one server: `start` refuses to replace a running one;
# give each concurrent server its own BATON_KUBE_ENV. KUBE_TEST_APISERVER_ARGS,
# if set for `start`, adds arguments to kube-apiserver (kept for `revive`), for
# example --watch-cache=false.
#
# Needs root (or password-less sudo) the first time, for apt-get.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"

kube="$BATON_CACHE/kube"
env_file="${BATON_KUBE_ENV:-$kube/run/env.sh}"
apiserver_bin="$kube/bin/kube-apiserver"
users=(baton-a baton-b baton-c nobody)
# Changes whenever the way kube-apiserver is built changes, so that a binary
# built the old way is rebuilt.
build_recipe="kube-apiserver from Debian source kubernetes, reflect2 v1.0.2"

log() { echo "kube-testenv: $*" >&2; }
die() { echo "kube-testenv: error: $*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        die "need root (or sudo) to run: $*"
    fi
}

# ---------------------------------------------------------------- install

# Debian source entries derived from the machine's own Debian entries, so no
# host is named here: deb822 files get their `Types: deb` turned into
# `Types: deb-src`, one-line files their `deb ` lines into `deb-src `.
enable_deb_src() {
    local changed=1 d822=/etc/apt/sources.list.d/debian.sources
    local out822=/etc/apt/sources.list.d/baton-deb-src.sources
    local one=/etc/apt/sources.list out1=/etc/apt/sources.list.d/baton-deb-src.list
    if [ -f "$d822" ]; then
        local want
        want="$(sed -E -n '/^Types:/!{p;d}; /^Types:(.*[[:space:]])?deb([[:space:]]|$)/{s/^Types:.*/Types: deb-src/;p}' "$d822")"
        # Keep only stanzas that were binary ones: a stanza whose Types line was
        # not `deb` loses its Types line above, so drop stanzas without one.
        want="$(printf '%s\n' "$want" | awk 'BEGIN{RS="";ORS="\n\n"} /(^|\n)Types: deb-src/')"
        if [ ! -f "$out822" ] || [ "$(cat "$out822")" != "$want" ]; then
            log "enabling Debian source entries (from $d822) in $out822"
            printf '%s\n' "$want" | as_root tee "$out822" >/dev/null
            changed=0
        fi
    fi
    if [ -f "$one" ] && grep -q '^deb ' "$one"; then
        local want1
        want1="$(sed -n 's/^deb /deb-src /p' "$one")"
        if [ ! -f "$out1" ] || [ "$(cat "$out1")" != "$want1" ]; then
            log "enabling Debian source entries (from $one) in $out1"
            printf '%s\n' "$want1" | as_root tee "$out1" >/dev/null
            changed=0
        fi
    fi
    return $changed
}

apt_updated=
apt_update() {
    if [ -z "$apt_updated" ]; then
        log "apt-get update"
        as_root apt-get update -qq >&2
        apt_updated=1
    fi
}

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

install_packages() {
    local pkgs=(golang-go etcd-server rsync openssl) missing=() p
    for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        # Packages without an installation candidate need fresh lists.
        for p in "${missing[@]}"; do
            if ! apt-cache policy "$p" 2>/dev/null | grep 'Candidate: [0-9]' >/dev/null; then apt_update; break; fi
        done
        log "apt-get install -y ${missing[*]}"
        if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2; then
            [ -z "$apt_updated" ] || die "apt-get install ${missing[*]} failed"
            log "apt-get install failed: updating the package lists and trying again"
            apt_update
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 ||
                die "apt-get install ${missing[*]} failed"
        fi
    fi
}

# kubectl 1.20 from Debian's kubernetes-client. If another package owns
# /usr/bin/kubectl (for example the Google Cloud SDK's), installing it would
# fail on the file conflict (or replace someone's own kubectl): then the .deb
# is unpacked into the cache instead.
# Prints the path of a working kubectl 1.20, or nothing.
install_kubectl() {
    local k owner deb
    if installed kubernetes-client; then
        k=/usr/bin/kubectl
    elif [ -x "$kube/bin/kubectl" ]; then
        k="$kube/bin/kubectl"
    else
        owner="$(dpkg-query -S /usr/bin/kubectl 2>/dev/null | cut -d: -f1 | sed 's/^/package /' || true)"
        if [ -z "$owner" ] && { [ -e /usr/bin/kubectl ] || [ -L /usr/bin/kubectl ]; }; then
            owner="a file of no package"
        fi
        if [ -z "$owner" ]; then
            log "apt-get install -y kubernetes-client"
            if as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >&2; then
                k=/usr/bin/kubectl
            fi
        else
            log "/usr/bin/kubectl is already there ($owner): unpacking Debian's kubernetes-client into $kube/bin instead of installing it"
            rm -rf "$kube/deb" && mkdir -p "$kube/deb/x" "$kube/bin"
            if (cd "$kube/deb" && apt-get download -qq kubernetes-client >&2) &&
                deb="$(ls "$kube"/deb/kubernetes-client_*.deb 2>/dev/null | head -n1)" && [ -n "$deb" ] &&
                dpkg-deb -x "$deb" "$kube/deb/x" && [ -x "$kube/deb/x/usr/bin/kubectl" ]; then
                cp "$kube/deb/x/usr/bin/kubectl" "$kube/bin/kubectl.tmp" && mv "$kube/bin/kubectl.tmp" "$kube/bin/kubectl"
                k="$kube/bin/kubectl"
            fi
            rm -rf "$kube/deb"
        fi
    fi
    if [ -n "${k:-}" ] && "$k" version --client --short 2>/dev/null | grep 'v1\.20\.' >/dev/null; then
        echo "$k"
    else
        log "kubectl 1.20 (Debian's kubernetes-client) is not available: kubectl-based steps will be skipped"
    fi
}

# Kubernetes 1.20 vendors github.com/modern-go/reflect2 v1.0.1, which is broken
# under Go 1.18 and later: built with Debian's Go 1.19, the API server panics
# (nil pointer in reflect2.Type2, answered as an HTTP/2 INTERNAL_ERROR) when it
# decodes some objects, for example a Namespace or a ConfigMap created by
# kubectl. v1.0.2 is the fix, with the same API; Debian packages it
# (golang-github-modern-go-reflect2-dev), so its files replace the vendored ones.
fix_reflect2() {
    local tree="$1" vend="$1/vendor/github.com/modern-go/reflect2" deb x
    grep -q '^# github.com/modern-go/reflect2 v1\.0\.1 ' "$tree/vendor/modules.txt" || return 0
    [ -f "$vend/go_above_118.go" ] && return 0
    deb="$(ls "$kube"/src/golang-github-modern-go-reflect2-dev_*.deb 2>/dev/null | head -n1 || true)"
    if [ -z "$deb" ]; then
        log "apt-get download golang-github-modern-go-reflect2-dev (reflect2 v1.0.2, for Go 1.19)"
        (cd "$kube/src" && apt-get download -qq golang-github-modern-go-reflect2-dev >&2) ||
            die "cannot download golang-github-modern-go-reflect2-dev"
        deb="$(ls "$kube"/src/golang-github-modern-go-reflect2-dev_*.deb | head -n1)"
    fi
    x="$(mktemp -d)"
    dpkg-deb -x "$deb" "$x"
    [ -f "$x/usr/share/gocode/src/github.com/modern-go/reflect2/go_above_118.go" ] ||
        die "$deb does not hold reflect2 v1.0.2 or later"
    log "replacing the vendored reflect2 v1.0.1 with $(basename "$deb")"
    rm -f "$vend"/*.go "$vend"/*.s
    cp "$x"/usr/share/gocode/src/github.com/modern-go/reflect2/*.go \
        "$x"/usr/share/gocode/src/github.com/modern-go/reflect2/*.s "$vend/"
    rm -rf "$x"
}

build_apiserver() {
    local src="$kube/src" tarball tree version
    mkdir -p "$src" "$kube/bin"
    tarball="$(ls "$src"/kubernetes_*.orig.tar.* 2>/dev/null | head -n1 || true)"
    if [ -z "$tarball" ]; then
        if ! apt-cache showsrc kubernetes 2>/dev/null | grep '^Package: kubernetes' >/dev/null; then apt_update; fi
        log "apt-get source --download-only kubernetes (into $src)"
        # apt drops privileges to _apt when it can; the cache may not be
        # readable to it, which only costs a warning.
        (cd "$src" && apt-get source --download-only -qq kubernetes >&2) ||
            die "apt-get source kubernetes failed (are deb-src entries enabled? see above)"
        tarball="$(ls "$src"/kubernetes_*.orig.tar.* 2>/dev/null | head -n1 || true)"
        [ -n "$tarball" ] || die "no kubernetes_*.orig.tar.* in $src after apt-get source"
    fi
    # kubernetes_1.20.5+really1.20.2.orig.tar.gz -> 1.20.2
    version="$(basename "$tarball" | sed -E 's/^kubernetes_//; s/\.orig\.tar\..*$//; s/^.*really//')"
    tree="$src/kubernetes-$version"
    if [ ! -f "$tree/Makefile" ]; then
        log "unpacking $(basename "$tarball")"
        rm -rf "$tree" "$tree.tmp" && mkdir -p "$tree.tmp"
        tar -xf "$tarball" -C "$tree.tmp"
        # The tarball has one top folder, whatever its name.
        local top
        top="$(find "$tree.tmp" -mindepth 1 -maxdepth 1)"
        if [ "$(printf '%s\n' "$top" | wc -l)" -eq 1 ] && [ -d "$top" ] && [ ! -f "$tree.tmp/Makefile" ]; then
            mv "$top" "$tree" && rmdir "$tree.tmp"
        else
            mv "$tree.tmp" "$tree"
        fi
    fi
    fix_reflect2 "$tree"
    log "building kube-apiserver v$version (GOPATH layout, make WHAT=cmd/kube-apiserver; a few minutes the first time)"
    (
        cd "$tree"
        export GOPATH="$PWD/.go" CGO_ENABLED=0 HOME="$PWD/.home" KUBE_GIT_VERSION="v$version"
        # go must be Debian's (the one golang-go installs), not another on PATH.
        export PATH="/usr/lib/go/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        unset GOROOT GOFLAGS GO111MODULE
        mkdir -p .go/src/k8s.io "$HOME"
        ln -sfn ../../.. .go/src/k8s.io/kubernetes
        cd .go/src/k8s.io/kubernetes
        attempt() { make WHAT=cmd/kube-apiserver >"$kube/src/build.log" 2>&1; }
        # A failed generator build leaves an empty file that later runs try to
        # execute, so a failed attempt's _output goes before the next one.
        if ! attempt; then
            tail -n 20 "$kube/src/build.log" >&2
            log "build failed; deleting _output and trying once more"
            rm -rf _output
            attempt || { tail -n 40 "$kube/src/build.log" >&2; rm -rf _output; exit 1; }
        fi
    ) || die "building kube-apiserver failed (log: $kube/src/build.log)"
    [ -x "$tree/_output/bin/kube-apiserver" ] || die "the build made no $tree/_output/bin/kube-apiserver"
    cp "$tree/_output/bin/kube-apiserver" "$apiserver_bin.tmp"
    mv "$apiserver_bin.tmp" "$apiserver_bin"
    echo "$build_recipe" >"$apiserver_bin.recipe"
    # The build tree and Go caches are several GB; the tarball stays for a rebuild.
    log "built $apiserver_bin; deleting the build tree"
    chmod -R u+w "$tree" 2>/dev/null || true
    rm -rf "$tree"
}

cmd_install() {
    mkdir -p "$kube/bin"
    # One install at a time per cache (another checkout or test run may be at it).
    exec 9>"$kube/.install.lock"
    flock 9
    local t0=$SECONDS kubectl
    if enable_deb_src; then apt_update; fi
    install_packages
    command -v etcd >/dev/null || die "etcd not found after installing etcd-server"
    kubectl="$(install_kubectl)"
    if [ -x "$apiserver_bin" ] && [ "$(cat "$apiserver_bin.recipe" 2>/dev/null)" = "$build_recipe" ] &&
        "$apiserver_bin" --version >/dev/null 2>&1; then
        :
    else
        build_apiserver
    fi
    printf '%s\n' "$kubectl" >"$kube/kubectl-path"
    log "installed: $("$apiserver_bin" --version), $(etcd --version | head -n1), kubectl: ${kubectl:-none} ($((SECONDS - t0))s)"
    exec 9>&-
}

# ---------------------------------------------------------------- start / stop

# Sets variable $1 to a free TCP port on 127.0.0.1, below the kernel's
# ephemeral range so that an outgoing connection does not take it meanwhile.
taken_ports=" "
free_port() {
    local p i listening
    listening=" $(ss -Hltn 2>/dev/null | awk '{n=split($4,a,":"); print a[n]}' | tr '\n' ' ') "
    for i in $(seq 1 200); do
        p=$((20000 + RANDOM % 12000))
        case "$listening$taken_ports" in *" $p "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            taken_ports+="$p "
            printf -v "$1" '%s' "$p"
            return
        fi
    done
    die "found no free port"
}

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }

# Is $1 still the process we started (name $2), and not a zombie? Guards
# against reused pids, and against a PID 1 that does not reap orphans.
is_ours() {
    alive "$1" && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] &&
        [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

read_env() {
    KUBE_TEST_APISERVER_PID= KUBE_TEST_ETCD_PID= KUBE_TEST_SERVER= KUBE_TEST_APISERVER_LOG= KUBE_TEST_ETCD_URL=
    [ -f "$env_file" ] || return 1
    # shellcheck disable=SC1090
    . "$env_file"
}

write_kubeconfig() { # file user token
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: baton-test
  cluster:
    server: $KUBE_TEST_SERVER
    certificate-authority: $KUBE_TEST_CA
users:
- name: $2
  user:
    token: $3
contexts:
- name: $2@baton-test
  context:
    cluster: baton-test
    user: $2
    namespace: default
current-context: $2@baton-test
EOF
    chmod 600 "$1"
}

stop_pid() { # pid name
    local i
    is_ours "$1" "$2" || return 0
    kill "$1" 2>/dev/null || true
    for i in $(seq 1 100); do
        is_ours "$1" "$2" || return 0
        sleep 0.1
    done
    log "$2 (pid $1) did not stop in 10s: killing it"
    kill -KILL "$1" 2>/dev/null || true
}

# launch_etcd DIR: starts etcd on the ports in DIR/ports, with its data in
# DIR/etcd (kept from an earlier run); sets $launched to its pid.
launch_etcd() {
    local dir="$1" etcd_port peer_port api_port
    read -r etcd_port peer_port api_port <"$dir/ports"
    setsid etcd --name baton-test --data-dir "$dir/etcd" \
        --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-cluster "baton-test=http://127.0.0.1:$peer_port" \
        </dev/null >>"$dir/etcd.log" 2>&1 &
    launched=$!
    echo "$launched" >"$dir/etcd.pid"
}

# wait_etcd DIR PID: until etcd answers its health check.
wait_etcd() {
    local dir="$1" pid="$2" etcd_port peer_port api_port i
    read -r etcd_port peer_port api_port <"$dir/ports"
    for i in $(seq 1 300); do
        curl -fsS "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep '"health":"true"' >/dev/null && return 0
        alive "$pid" || { tail -n 20 "$dir/etcd.log" >&2; die "etcd exited (log: $dir/etcd.log)"; }
        sleep 0.1
    done
    die "etcd is not healthy after 30s (log: $dir/etcd.log)"
}

# launch_apiserver DIR: starts kube-apiserver on the ports in DIR/ports, with
# the certificates, tokens and keys in DIR; sets $launched to its pid.
launch_apiserver() {
    local dir="$1" etcd_port peer_port api_port
    read -r etcd_port peer_port api_port <"$dir/ports"
    local extra=()
    [ ! -s "$dir/apiserver-args" ] || read -r -a extra <"$dir/apiserver-args"
    setsid "$apiserver_bin" --etcd-servers="http://127.0.0.1:$etcd_port" \
        --bind-address=127.0.0.1 --secure-port="$api_port" --insecure-port=0 \
        --cert-dir="$dir/certs" --token-auth-file="$dir/tokens.csv" --authorization-mode=RBAC \
        --service-account-issuer=https://kubernetes.default.svc \
        --service-account-key-file="$dir/sa.key" --service-account-signing-key-file="$dir/sa.key" \
        --service-cluster-ip-range=10.0.0.0/24 --advertise-address=127.0.0.1 "${extra[@]}" \
        </dev/null >>"$dir/apiserver.log" 2>&1 &
    launched=$!
    echo "$launched" >"$dir/apiserver.pid"
}

# wait_ready PID: until the API server of the env file answers /readyz
# (90 s covers a loaded 2-core machine); 1 if it exited or never did.
wait_ready() {
    local pid="$1" t0=$SECONDS
    while [ $((SECONDS - t0)) -lt 90 ]; do
        alive "$pid" || return 1
        if [ -f "$KUBE_TEST_CA" ] && [ "$(curl -sS --cacert "$KUBE_TEST_CA" -H "Authorization: Bearer $KUBE_TEST_ADMIN_TOKEN" \
            "$KUBE_TEST_SERVER/readyz" 2>/dev/null)" = ok ]; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

write_env() {
    local vars=(KUBE_TEST_SERVER KUBE_TEST_CA KUBE_TEST_ADMIN_TOKEN KUBE_TEST_KUBECONFIG
        KUBE_TEST_KUBECONFIG_DIR KUBE_TEST_APISERVER_PID KUBE_TEST_ETCD_PID
        KUBE_TEST_APISERVER_LOG KUBE_TEST_KUBECTL KUBE_TEST_ETCD_URL) v
    mkdir -p "$(dirname "$env_file")"
    { for v in "${vars[@]}"; do printf 'export %s=%q\n' "$v" "${!v}"; done; } >"$env_file.tmp"
    chmod 600 "$env_file.tmp" && mv "$env_file.tmp" "$env_file"
}

cmd_start() {
    cmd_install
    local kubectl
    kubectl="$(cat "$kube/kubectl-path")"
    if read_env && { is_ours "$KUBE_TEST_APISERVER_PID" kube-apiserver || is_ours "$KUBE_TEST_ETCD_PID" etcd; }; then
        die "a test API server described by $env_file already runs ($KUBE_TEST_SERVER, pids $KUBE_TEST_APISERVER_PID/$KUBE_TEST_ETCD_PID): stop it first (scripts/kube-testenv.sh stop), or set BATON_KUBE_ENV to another file"
    fi
    mkdir -p "$kube/run"
    # Logs of servers stopped earlier are kept until the next start.
    local old
    for old in "$kube"/run/inst-*; do
        [ -f "$old/stopped" ] && rm -rf "$old"
    done
    local dir
    dir="$(mktemp -d "$kube/run/inst-$(date +%Y%m%d-%H%M%S)-XXXX")"
    chmod 700 "$dir"
    mkdir -p "$dir/certs" "$dir/kubeconfig"
    local etcd_port peer_port api_port
    free_port etcd_port; free_port peer_port; free_port api_port

    echo "$etcd_port $peer_port $api_port" >"$dir/ports"
    echo "${KUBE_TEST_APISERVER_ARGS:-}" >"$dir/apiserver-args"
    log "starting etcd on 127.0.0.1:$etcd_port (data in $dir/etcd)"
    launch_etcd "$dir"
    local etcd_pid=$launched

    local admin_token u
    admin_token="$(openssl rand -hex 24)"
    {
        echo "$admin_token,admin,admin,system:masters"
        for u in "${users[@]}"; do echo "$(openssl rand -hex 24),$u,$u"; done
    } >"$dir/tokens.csv"
    chmod 600 "$dir/tokens.csv"
    openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null

    wait_etcd "$dir" "$etcd_pid"

    log "starting kube-apiserver on https://127.0.0.1:$api_port${KUBE_TEST_APISERVER_ARGS:+ with $KUBE_TEST_APISERVER_ARGS}"
    launch_apiserver "$dir"
    local api_pid=$launched

    KUBE_TEST_SERVER="https://127.0.0.1:$api_port"
    KUBE_TEST_CA="$dir/certs/apiserver.crt"
    KUBE_TEST_ADMIN_TOKEN="$admin_token"
    KUBE_TEST_KUBECONFIG="$dir/kubeconfig/admin.kubeconfig"
    KUBE_TEST_KUBECONFIG_DIR="$dir/kubeconfig"
    KUBE_TEST_APISERVER_PID="$api_pid"
    KUBE_TEST_ETCD_PID="$etcd_pid"
    KUBE_TEST_APISERVER_LOG="$dir/apiserver.log"
    KUBE_TEST_KUBECTL="$kubectl"
    KUBE_TEST_ETCD_URL="http://127.0.0.1:$etcd_port"
    # Written before waiting, so that `stop` finds the processes even if the
    # wait below fails or is interrupted.
    write_env
    echo "$env_file" >"$dir/env-file"

    # Ready within seconds.
    local ready= t0=$SECONDS
    wait_ready "$api_pid" && ready=1
    if [ -z "$ready" ]; then
        echo "----- last lines of $dir/apiserver.log" >&2
        tail -n 30 "$dir/apiserver.log" >&2
        echo "-----" >&2
        if alive "$api_pid"; then
            log "kube-apiserver is not ready after 90s"
        else
            log "kube-apiserver exited"
        fi
        cmd_stop
        die "the test API server did not become ready (log: $dir/apiserver.log, kept until the next start)"
    fi

    write_kubeconfig "$KUBE_TEST_KUBECONFIG" admin "$admin_token"
    local line tok
    for u in "${users[@]}"; do
        line="$(grep ",$u,$u\$" "$dir/tokens.csv")"
        tok="${line%%,*}"
        write_kubeconfig "$dir/kubeconfig/$u.kubeconfig" "$u" "$tok"
    done
    log "ready in $((SECONDS - t0))s: $KUBE_TEST_SERVER (apiserver pid $api_pid, etcd pid $etcd_pid); env file: $env_file"
    cat "$env_file"
}

cmd_stop() {
    if ! read_env; then
        log "not running (no $env_file)"
        return 0
    fi
    local dir
    dir="$(dirname "$KUBE_TEST_APISERVER_LOG")"
    stop_pid "$KUBE_TEST_APISERVER_PID" kube-apiserver
    stop_pid "$KUBE_TEST_ETCD_PID" etcd
    # Data, keys and tokens go now; the logs stay until the next start.
    if [ -d "$dir" ] && [[ "$dir" == "$kube"/run/inst-* ]]; then
        rm -rf "$dir/etcd" "$dir/certs" "$dir/kubeconfig" "$dir/tokens.csv" "$dir/sa.key"
        touch "$dir/stopped"
    fi
    rm -f "$env_file"
    log "stopped (pids $KUBE_TEST_APISERVER_PID, $KUBE_TEST_ETCD_PID); logs in $dir"
}

cmd_status() {
    if ! read_env; then
        echo "not running (no $env_file)"
        return 1
    fi
    local api=stopped etcd=stopped ready=no
    is_ours "$KUBE_TEST_APISERVER_PID" kube-apiserver && api="running (pid $KUBE_TEST_APISERVER_PID)"
    is_ours "$KUBE_TEST_ETCD_PID" etcd && etcd="running (pid $KUBE_TEST_ETCD_PID)"
    if [ "$(curl -sS --max-time 5 --cacert "$KUBE_TEST_CA" -H "Authorization: Bearer $KUBE_TEST_ADMIN_TOKEN" \
        "$KUBE_TEST_SERVER/readyz" 2>/dev/null)" = ok ]; then ready=yes; fi
    echo "kube-apiserver: $api, etcd: $etcd, $KUBE_TEST_SERVER ready: $ready (env file: $env_file)"
    [ "$ready" = yes ]
}

cmd_revive() {
    read_env || die "not running (no $env_file): start it first"
    local dir t0=$SECONDS
    dir="$(dirname "$KUBE_TEST_APISERVER_LOG")"
    [ -f "$dir/ports" ] || die "$dir was started by an older kube-testenv.sh: stop and start it"
    if ! is_ours "$KUBE_TEST_ETCD_PID" etcd; then
        log "starting etcd again (data in $dir/etcd)"
        launch_etcd "$dir"
        KUBE_TEST_ETCD_PID=$launched
        write_env
        wait_etcd "$dir" "$KUBE_TEST_ETCD_PID"
    fi
    if ! is_ours "$KUBE_TEST_APISERVER_PID" kube-apiserver; then
        log "starting kube-apiserver again on $KUBE_TEST_SERVER"
        launch_apiserver "$dir"
        KUBE_TEST_APISERVER_PID=$launched
        write_env
    fi
    wait_ready "$KUBE_TEST_APISERVER_PID" ||
        die "the test API server is not ready after it was started again (log: $KUBE_TEST_APISERVER_LOG)"
    log "ready again in $((SECONDS - t0))s (apiserver pid $KUBE_TEST_APISERVER_PID, etcd pid $KUBE_TEST_ETCD_PID)"
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
revive) cmd_revive ;;
*)
    echo "usage: $0 install|start|stop|status|revive" >&2
    exit 2
    ;;
esac
