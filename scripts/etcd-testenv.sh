#!/usr/bin/env bash
# A real etcd cluster for tests, on loopback: three members of Debian's
# etcd-server 3.4 (the engine a fleet without Kubernetes already runs), each
# with a plain and a TLS (client-certificate) client listener.
#
#   scripts/etcd-testenv.sh install        install Debian's etcd-server, etcd-client
#                                          (etcdctl), openssl and curl (seconds when done)
#   scripts/etcd-testenv.sh start          install, then start the three members on free
#                                          loopback ports; prints `export ...` lines, so
#                                          `eval "$(scripts/etcd-testenv.sh start)"` works
#   scripts/etcd-testenv.sh stop           stop them (by their recorded process ids) and
#                                          delete their data and keys; safe to call twice
#   scripts/etcd-testenv.sh status         says whether all three run (exit 0 if so)
#   scripts/etcd-testenv.sh kill N         SIGKILL member N (0, 1 or 2)
#   scripts/etcd-testenv.sh pause N        SIGSTOP member N; `resume N` sends SIGCONT
#   scripts/etcd-testenv.sh revive         starts again every member that is gone, on the
#                                          same ports and data, and waits for a healthy
#                                          cluster
#   scripts/etcd-testenv.sh leader         prints the index of the raft leader
#   scripts/etcd-testenv.sh snapshot FILE  saves a snapshot of the cluster to FILE
#   scripts/etcd-testenv.sh restore FILE   stops the members, restores FILE into fresh data
#                                          (same names, ports and token), starts them and
#                                          waits for a healthy cluster: revisions and raft
#                                          terms go back, as after an operator's restore
#
# The members' data live on tmpfs (/dev/shm), so that their fsyncs do not
# wait behind a build's gigabytes of dirty pages; a member killed keeps its
# data (the page cache outlives the process). Heartbeat 50 ms, election
# timeout 500 ms: a new raft leader within about a second of losing one, well
# inside the tests' renew deadline.
#
# `start` writes an env file ($BATON_ETCD_ENV, default
# $BATON_CACHE/etcd/run/env.sh) that exports:
#   ETCD_TEST_ENDPOINTS      the three plain client URLs, comma-separated
#   ETCD_TEST_TLS_ENDPOINTS  the three TLS client URLs (client certificates required)
#   ETCD_TEST_CA, ETCD_TEST_CLIENT_CERT, ETCD_TEST_CLIENT_KEY
#   ETCD_TEST_PIDS           the members' process ids, space-separated
#   ETCD_TEST_DIR            the run's folder (logs: m0.log, m1.log, m2.log)
#   ETCD_TEST_ETCDCTL        etcdctl
# One env file describes one cluster: `start` refuses to replace a running
# one; give each concurrent cluster its own BATON_ETCD_ENV. No ETCD_* or
# ETCDCTL_* variable of the caller reaches the members.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"

base="$BATON_CACHE/etcd"
env_file="${BATON_ETCD_ENV:-$base/run/env.sh}"
members=(0 1 2)

log() { echo "etcd-testenv: $*" >&2; }
die() { echo "etcd-testenv: error: $*" >&2; exit 1; }

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

cmd_install() {
    local missing=() p
    for p in etcd-server etcd-client openssl curl; do
        installed "$p" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    mkdir -p "$base"
    exec 8>"$base/.install.lock"
    flock 8
    log "installing ${missing[*]}"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
        as_root apt-get update -q >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    fi
    # Debian's package starts a member of its own on port 2379: not ours.
    if command -v systemctl >/dev/null 2>&1; then as_root systemctl disable --now etcd >/dev/null 2>&1 || true; fi
}

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

# Is $1 still an etcd we started, and not a zombie?
is_ours() {
    alive "$1" && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = etcd ] &&
        [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

read_env() {
    ETCD_TEST_DIR= ETCD_TEST_PIDS=
    [ -f "$env_file" ] || return 1
    # shellcheck disable=SC1090
    . "$env_file"
}

write_env() {
    local vars=(ETCD_TEST_ENDPOINTS ETCD_TEST_TLS_ENDPOINTS ETCD_TEST_CA ETCD_TEST_CLIENT_CERT
        ETCD_TEST_CLIENT_KEY ETCD_TEST_PIDS ETCD_TEST_DIR ETCD_TEST_ETCDCTL) v
    mkdir -p "$(dirname "$env_file")"
    { for v in "${vars[@]}"; do printf 'export %s=%q\n' "$v" "${!v}"; done; } >"$env_file.tmp"
    chmod 600 "$env_file.tmp" && mv "$env_file.tmp" "$env_file"
}

# A CA, a server certificate for 127.0.0.1 and localhost, and a client
# certificate (CN baton), in DIR/pki.
make_pki() {
    local pki="$1/pki"
    mkdir -p "$pki"
    (
        cd "$pki"
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=baton etcd test CA" \
            -keyout ca.key -out ca.crt 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=etcd" -keyout server.key -out server.csr 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >server.ext
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
            -extfile server.ext -out server.crt 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=baton" -keyout client.key -out client.csr 2>/dev/null
        printf 'extendedKeyUsage=clientAuth\n' >client.ext
        openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
            -extfile client.ext -out client.crt 2>/dev/null
        chmod 600 ./*.key
    )
}

# The ports of member N: client, TLS client, peer.
ports_of() { sed -n "$(($1 + 1))p" "$ETCD_TEST_DIR/ports"; }

# launch DIR N STATE: starts member N (`new` the first time, `existing`
# after); prints its pid.
launch() {
    local dir="$1" n="$2" state="$3" client tls peer cluster="" i c t p
    read -r client tls peer < <(ports_of "$n")
    for i in "${members[@]}"; do
        read -r c t p < <(ports_of "$i")
        cluster+="${cluster:+,}m$i=http://127.0.0.1:$p"
    done
    # No ETCD_* variable of the caller: etcd reads them as flags.
    env $(env | awk -F= '/^ETCD(CTL)?_/ {printf "-u %s ", $1}') \
        setsid etcd --name "m$n" --data-dir "$dir/data/m$n" \
        --listen-client-urls "http://127.0.0.1:$client,https://127.0.0.1:$tls" \
        --advertise-client-urls "http://127.0.0.1:$client,https://127.0.0.1:$tls" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "$cluster" --initial-cluster-state "$state" \
        --initial-cluster-token "$(cat "$dir/token")" \
        --cert-file "$dir/pki/server.crt" --key-file "$dir/pki/server.key" \
        --trusted-ca-file "$dir/pki/ca.crt" --client-cert-auth \
        --heartbeat-interval 50 --election-timeout 500 \
        </dev/null >>"$dir/m$n.log" 2>&1 &
    echo $!
}

# Until every member answers its health check (a cluster with a leader).
wait_healthy() {
    local t0=$SECONDS n client tls peer ok
    while [ $((SECONDS - t0)) -lt 60 ]; do
        ok=1
        for n in "${members[@]}"; do
            read -r client tls peer < <(ports_of "$n")
            curl -fsS "http://127.0.0.1:$client/health" 2>/dev/null | grep -q '"health":"true"' || ok=0
        done
        [ "$ok" = 1 ] && return 0
        sleep 0.1
    done
    for n in "${members[@]}"; do tail -n 5 "$ETCD_TEST_DIR/m$n.log" >&2; done
    die "the cluster is not healthy after 60s (logs: $ETCD_TEST_DIR/m*.log)"
}


cmd_start() {
    cmd_install
    if read_env; then
        local p
        for p in $ETCD_TEST_PIDS; do
            is_ours "$p" && die "a cluster of $env_file runs already (pids $ETCD_TEST_PIDS): stop it first"
        done
    fi
    mkdir -p "$base/run"
    find "$base/run" -maxdepth 1 -name 'inst-*' -type d -exec test -e '{}/stopped' ';' -prune -exec rm -rf '{}' + 2>/dev/null || true
    ETCD_TEST_DIR="$(mktemp -d "$base/run/inst-$(date +%Y%m%d-%H%M%S)-XXXX")"
    local data n client tls peer endpoints="" tls_endpoints="" pids=""
    data="$(mktemp -d -p /dev/shm baton-etcd-XXXX 2>/dev/null || mktemp -d)"
    ln -s "$data" "$ETCD_TEST_DIR/data"
    openssl rand -hex 8 >"$ETCD_TEST_DIR/token"
    make_pki "$ETCD_TEST_DIR"
    : >"$ETCD_TEST_DIR/ports"
    for n in "${members[@]}"; do
        free_port client; free_port tls; free_port peer
        echo "$client $tls $peer" >>"$ETCD_TEST_DIR/ports"
        endpoints+="${endpoints:+,}http://127.0.0.1:$client"
        tls_endpoints+="${tls_endpoints:+,}https://127.0.0.1:$tls"
    done
    ETCD_TEST_ENDPOINTS="$endpoints" ETCD_TEST_TLS_ENDPOINTS="$tls_endpoints"
    ETCD_TEST_CA="$ETCD_TEST_DIR/pki/ca.crt"
    ETCD_TEST_CLIENT_CERT="$ETCD_TEST_DIR/pki/client.crt" ETCD_TEST_CLIENT_KEY="$ETCD_TEST_DIR/pki/client.key"
    ETCD_TEST_ETCDCTL="$(command -v etcdctl || true)"
    for n in "${members[@]}"; do pids+="${pids:+ }$(launch "$ETCD_TEST_DIR" "$n" new)"; done
    ETCD_TEST_PIDS="$pids"
    # Written before waiting: `stop` works after a failed start.
    write_env
    wait_healthy
    log "three members at $ETCD_TEST_ENDPOINTS (pids $ETCD_TEST_PIDS); env in $env_file"
    cat "$env_file"
}

stop_pid() {
    local i
    is_ours "$1" || return 0
    kill -CONT "$1" 2>/dev/null || true
    kill "$1" 2>/dev/null || true
    for i in $(seq 1 100); do
        is_ours "$1" || return 0
        sleep 0.1
    done
    kill -KILL "$1" 2>/dev/null || true
}

cmd_stop() {
    read_env || return 0
    local p
    for p in $ETCD_TEST_PIDS; do stop_pid "$p"; done
    if [ -n "$ETCD_TEST_DIR" ] && [ -d "$ETCD_TEST_DIR" ]; then
        rm -rf "$(readlink "$ETCD_TEST_DIR/data" 2>/dev/null || echo /nonexistent)" "$ETCD_TEST_DIR/data" "$ETCD_TEST_DIR/pki"
        touch "$ETCD_TEST_DIR/stopped"
        log "stopped (pids $ETCD_TEST_PIDS); logs in $ETCD_TEST_DIR"
    fi
    rm -f "$env_file"
}

cmd_status() {
    read_env || { echo "not started"; return 1; }
    local p n=0 up=0
    for p in $ETCD_TEST_PIDS; do
        if is_ours "$p"; then echo "m$n: running (pid $p)"; up=$((up + 1)); else echo "m$n: gone"; fi
        n=$((n + 1))
    done
    [ "$up" = 3 ]
}

# member N: its pid.
pid_of() {
    read_env || die "no cluster (no $env_file)"
    case "${1:-}" in 0 | 1 | 2) ;; *) die "a member is 0, 1 or 2, not '${1:-}'" ;; esac
    local pids
    read -r -a pids <<<"$ETCD_TEST_PIDS"
    echo "${pids[$1]}"
}

cmd_signal() { # SIGNAL N
    local p
    p="$(pid_of "$2")"
    is_ours "$p" || die "member $2 (pid $p) is not running"
    kill "-$1" "$p"
}

cmd_revive() {
    read_env || die "no cluster (no $env_file)"
    local pids=() new=() n
    read -r -a pids <<<"$ETCD_TEST_PIDS"
    for n in "${members[@]}"; do
        if is_ours "${pids[$n]}"; then
            kill -CONT "${pids[$n]}" 2>/dev/null || true
            new+=("${pids[$n]}")
        else
            new+=("$(launch "$ETCD_TEST_DIR" "$n" existing)")
        fi
    done
    ETCD_TEST_PIDS="${new[*]}"
    write_env
    wait_healthy
    log "revived: pids $ETCD_TEST_PIDS"
}

cmd_leader() {
    read_env || die "no cluster (no $env_file)"
    local n client tls peer
    for n in "${members[@]}"; do
        read -r client tls peer < <(ports_of "$n")
        if ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$client" endpoint status -w json 2>/dev/null |
            python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["Status"]; sys.exit(0 if s["leader"]==s["header"]["member_id"] else 1)'; then
            echo "$n"
            return 0
        fi
    done
    die "no member says it leads"
}

cmd_snapshot() {
    read_env || die "no cluster (no $env_file)"
    [ -n "${1:-}" ] || die "usage: $0 snapshot FILE"
    local client tls peer
    read -r client tls peer < <(ports_of "$(cmd_leader)")
    ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$client" snapshot save "$1" >&2
}

cmd_restore() {
    read_env || die "no cluster (no $env_file)"
    [ -f "${1:-}" ] || die "usage: $0 restore FILE (a snapshot saved by '$0 snapshot')"
    local p n i c t peer client tls cluster="" pids=""
    for p in $ETCD_TEST_PIDS; do stop_pid "$p"; done
    for i in "${members[@]}"; do
        read -r c t p < <(ports_of "$i")
        cluster+="${cluster:+,}m$i=http://127.0.0.1:$p"
    done
    for n in "${members[@]}"; do
        read -r client tls peer < <(ports_of "$n")
        rm -rf "$ETCD_TEST_DIR/data/m$n"
        ETCDCTL_API=3 etcdctl snapshot restore "$1" --name "m$n" --data-dir "$ETCD_TEST_DIR/data/m$n" \
            --initial-cluster "$cluster" --initial-cluster-token "$(cat "$ETCD_TEST_DIR/token")" \
            --initial-advertise-peer-urls "http://127.0.0.1:$peer" >>"$ETCD_TEST_DIR/restore.log" 2>&1 ||
            die "restoring m$n failed: $(tail -n 3 "$ETCD_TEST_DIR/restore.log")"
    done
    for n in "${members[@]}"; do pids+="${pids:+ }$(launch "$ETCD_TEST_DIR" "$n" new)"; done
    ETCD_TEST_PIDS="$pids"
    write_env
    wait_healthy
    log "restored $1: pids $ETCD_TEST_PIDS"
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
kill) cmd_signal KILL "${2:-}" ;;
pause) cmd_signal STOP "${2:-}" ;;
resume) cmd_signal CONT "${2:-}" ;;
revive) cmd_revive ;;
leader) cmd_leader ;;
snapshot) cmd_snapshot "${2:-}" ;;
restore) cmd_restore "${2:-}" ;;
*) die "usage: $0 install|start|stop|status|kill N|pause N|resume N|revive|leader|snapshot FILE|restore FILE" ;;
esac
