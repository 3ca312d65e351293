#!/usr/bin/env bash
# Real OCI registries for tests, on loopback: Debian's docker-registry (the
# Distribution registry v2, 2.8), three instances:
#   plain  HTTP, no authentication
#   auth   HTTP, basic authentication (an htpasswd file, bcrypt)
#   tls    HTTPS, no authentication, with a certificate of a self-signed test CA
#
#   scripts/registry-testenv.sh install   install the Debian packages (docker-registry,
#                                         apache2-utils for htpasswd, openssl, curl)
#                                         without starting or enabling the packaged
#                                         service; seconds when done
#   scripts/registry-testenv.sh start     install, then start the three on free loopback
#                                         ports, each with fresh storage; prints
#                                         `export ...` lines, so
#                                         `eval "$(scripts/registry-testenv.sh start)"` works
#   scripts/registry-testenv.sh stop      stop them (by their recorded process ids) and
#                                         delete their storage, keys and passwords;
#                                         safe to call twice
#   scripts/registry-testenv.sh status    says whether they run (exit 0 if all answer)
#   scripts/registry-testenv.sh revive    starts again whichever instance is no longer
#                                         running (stopped by a test), on the same port,
#                                         storage and keys, and updates the env file's pids
#   scripts/registry-testenv.sh selftest  pushes a blob and a manifest to each running
#                                         instance with curl and pulls them back (401
#                                         without credentials on auth; TLS verified with
#                                         the CA, refused without it)
#
# Everything lives in $BATON_CACHE/registry (scripts/env.sh), never in the
# clone: run/ holds one folder per start (its logs stay after `stop`, until
# the next `start`) and the default env file.
#
# `start` writes an env file ($BATON_REGISTRY_ENV, default
# $BATON_CACHE/registry/run/env.sh) that exports:
#   BATON_REGISTRY_PLAIN          127.0.0.1:PORT (http, anonymous push and pull)
#   BATON_REGISTRY_AUTH           127.0.0.1:PORT (http, basic authentication)
#   BATON_REGISTRY_AUTH_USER      its user
#   BATON_REGISTRY_AUTH_PASSWORD  its password (random per start)
#   BATON_REGISTRY_TLS            127.0.0.1:PORT (https; the certificate names
#                                 127.0.0.1 and localhost)
#   BATON_REGISTRY_CA             the test CA's certificate (PEM)
#   BATON_REGISTRY_{PLAIN,AUTH,TLS}_PID, BATON_REGISTRY_DIR (configs, logs)
# One env file describes one set: `start` refuses to replace a running one;
# give each concurrent set its own BATON_REGISTRY_ENV.
#
# Needs root (or password-less sudo) the first time, for apt-get.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"

reg="$BATON_CACHE/registry"
env_file="${BATON_REGISTRY_ENV:-$reg/run/env.sh}"
bin=/usr/bin/docker-registry
modes=(plain auth tls)

log() { echo "registry-testenv: $*" >&2; }
die() { echo "registry-testenv: error: $*" >&2; exit 1; }

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

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

apt_updated=
apt_update() {
    if [ -z "$apt_updated" ]; then
        log "apt-get update"
        as_root apt-get update -qq >&2
        apt_updated=1
    fi
}

# apt-get waits for another one's dpkg lock (up to 10 minutes) rather than
# failing; scripts/test.sh runs its installs one after another anyway.
apt_install() {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
        install -y -qq --no-install-recommends "$@" >&2
}

# The package's own service (port 5000, /var/lib/docker-registry) is never
# wanted: a policy-rc.d that refuses every start is in place during the
# install (an existing one is kept), and the service is disabled after, for
# whichever init system the machine has.
install_registry() {
    local pkgs=(docker-registry apache2-utils openssl curl) missing=() p policy=/usr/sbin/policy-rc.d ours=
    for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
    [ ${#missing[@]} -gt 0 ] || return 0
    for p in "${missing[@]}"; do
        # (grep without -q: an early exit would fail the pipe under pipefail)
        if ! apt-cache policy "$p" 2>/dev/null | grep 'Candidate: [0-9]' >/dev/null; then apt_update; break; fi
    done
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# registry-testenv.sh: no service starts during its install\nexit 101\n' |
            as_root tee "$policy" >/dev/null
        as_root chmod 755 "$policy"
        ours=1
    fi
    log "apt-get install -y ${missing[*]} (services not started)"
    local rc=0
    if ! apt_install "${missing[@]}"; then
        if [ -z "$apt_updated" ]; then
            log "apt-get install failed: updating the package lists and trying again"
            apt_update
            apt_install "${missing[@]}" || rc=1
        else
            rc=1
        fi
    fi
    [ -z "$ours" ] || as_root rm -f "$policy"
    [ "$rc" -eq 0 ] || die "apt-get install ${missing[*]} failed"
    disable_service
}

disable_service() {
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        as_root systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
    elif command -v deb-systemd-helper >/dev/null; then
        # No systemd running: drop the unit's enablement for a later boot with it.
        as_root deb-systemd-helper disable docker-registry.service >/dev/null 2>&1 || true
    fi
    if [ -x /etc/init.d/docker-registry ]; then
        as_root update-rc.d docker-registry disable >/dev/null 2>&1 || true
        if [ ! -d /run/systemd/system ]; then
            as_root /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
        fi
    fi
}

cmd_install() {
    mkdir -p "$reg"
    # One install at a time per cache (another checkout or test run may be at it).
    exec 8>"$reg/.install.lock"
    flock 8
    install_registry
    [ -x "$bin" ] || die "$bin not found after installing docker-registry"
    have_hasher || die "neither htpasswd (apache2-utils) nor python3's bcrypt is available"
    log "installed: $("$bin" --version 2>&1 | head -n1)"
    exec 8>&-
}

# The registry checks basic-auth passwords against bcrypt hashes only.
have_hasher() {
    command -v htpasswd >/dev/null || python3 -c 'import bcrypt' 2>/dev/null
}

# bcrypt_line USER PASSWORD: prints the htpasswd line.
bcrypt_line() {
    if command -v htpasswd >/dev/null; then
        htpasswd -nbB "$1" "$2" | head -n1
    else
        python3 -c 'import bcrypt,sys; print(sys.argv[1] + ":" + bcrypt.hashpw(sys.argv[2].encode(), bcrypt.gensalt(5)).decode())' "$1" "$2"
    fi
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

# Is $1 still a registry we started, and not a zombie? Guards against reused
# pids, and against a PID 1 that does not reap orphans.
is_ours() {
    alive "$1" && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = docker-registry ] &&
        [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

read_env() {
    BATON_REGISTRY_DIR= BATON_REGISTRY_PLAIN_PID= BATON_REGISTRY_AUTH_PID= BATON_REGISTRY_TLS_PID=
    [ -f "$env_file" ] || return 1
    # shellcheck disable=SC1090
    . "$env_file"
}

write_env() {
    local vars=(BATON_REGISTRY_PLAIN BATON_REGISTRY_AUTH BATON_REGISTRY_AUTH_USER
        BATON_REGISTRY_AUTH_PASSWORD BATON_REGISTRY_TLS BATON_REGISTRY_CA BATON_REGISTRY_DIR
        BATON_REGISTRY_PLAIN_PID BATON_REGISTRY_AUTH_PID BATON_REGISTRY_TLS_PID) v
    mkdir -p "$(dirname "$env_file")"
    { for v in "${vars[@]}"; do printf 'export %s=%q\n' "$v" "${!v}"; done; } >"$env_file.tmp"
    chmod 600 "$env_file.tmp" && mv "$env_file.tmp" "$env_file"
}

# make_ca DIR: a test CA, and a server certificate it signs for 127.0.0.1 and
# localhost (P-256; rustls wants a subjectAltName and a non-CA leaf).
make_ca() {
    local d="$1/certs"
    mkdir -p "$d"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
        -keyout "$d/ca.key" -out "$d/ca.crt" -subj "/CN=baton test registry CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$d/server.key" -out "$d/server.csr" -subj "/CN=127.0.0.1" 2>/dev/null
    printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
        "extendedKeyUsage=serverAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost" >"$d/server.ext"
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
        -days 30 -sha256 -extfile "$d/server.ext" -out "$d/server.crt" 2>/dev/null
    rm -f "$d/server.csr" "$d/server.ext" "$d/ca.srl"
    chmod 600 "$d"/*.key
}

# write_config DIR MODE PORT: DIR/MODE.yml.
write_config() {
    local dir="$1" mode="$2" port="$3"
    mkdir -p "$dir/$mode"
    {
        cat <<EOF
version: 0.1
log:
  level: info
  formatter: text
storage:
  filesystem:
    rootdirectory: $dir/$mode/storage
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:$port
  secret: $(openssl rand -hex 16)
EOF
        if [ "$mode" = tls ]; then
            cat <<EOF
  tls:
    certificate: $dir/certs/server.crt
    key: $dir/certs/server.key
EOF
        fi
        if [ "$mode" = auth ]; then
            cat <<EOF
auth:
  htpasswd:
    realm: baton-test-registry
    path: $dir/htpasswd
EOF
        fi
    } >"$dir/$mode.yml"
}

# launch DIR MODE: starts that instance; sets $launched to its pid.
launch() {
    local dir="$1" mode="$2"
    setsid "$bin" serve "$dir/$mode.yml" </dev/null >>"$dir/$mode.log" 2>&1 &
    launched=$!
    echo "$launched" >"$dir/$mode.pid"
}

# wait_up MODE ADDR PID: until /v2/ answers (200, or 401 on auth); 30 s.
wait_up() {
    local mode="$1" addr="$2" pid="$3" i code url="http://$2/v2/" tls=()
    if [ "$mode" = tls ]; then url="https://$addr/v2/" tls=(--cacert "$BATON_REGISTRY_CA"); fi
    for i in $(seq 1 300); do
        code="$(curl -sS -o /dev/null -w '%{http_code}' --max-time 2 "${tls[@]}" "$url" 2>/dev/null || true)"
        case "$mode:$code" in plain:200 | tls:200 | auth:401) return 0 ;; esac
        alive "$pid" || return 1
        sleep 0.1
    done
    return 1
}

addr_of() { # MODE
    case "$1" in
    plain) echo "$BATON_REGISTRY_PLAIN" ;;
    auth) echo "$BATON_REGISTRY_AUTH" ;;
    tls) echo "$BATON_REGISTRY_TLS" ;;
    esac
}

pid_var() { echo "BATON_REGISTRY_$(echo "$1" | tr a-z A-Z)_PID"; }

# up_or_die DIR MODE: waits for the instance of the env file; stops all and
# fails if it does not come up.
up_or_die() {
    local dir="$1" mode="$2" pv
    pv="$(pid_var "$mode")"
    if ! wait_up "$mode" "$(addr_of "$mode")" "${!pv}"; then
        echo "----- last lines of $dir/$mode.log" >&2
        tail -n 30 "$dir/$mode.log" >&2
        echo "-----" >&2
        cmd_stop
        die "the $mode registry did not come up (log: $dir/$mode.log, kept until the next start)"
    fi
}

cmd_start() {
    cmd_install
    if read_env && { is_ours "$BATON_REGISTRY_PLAIN_PID" || is_ours "$BATON_REGISTRY_AUTH_PID" ||
        is_ours "$BATON_REGISTRY_TLS_PID"; }; then
        die "test registries described by $env_file already run: stop them first (scripts/registry-testenv.sh stop), or set BATON_REGISTRY_ENV to another file"
    fi
    mkdir -p "$reg/run"
    # Logs of registries stopped earlier are kept until the next start.
    local old
    for old in "$reg"/run/inst-*; do
        [ -f "$old/stopped" ] && rm -rf "$old"
    done
    local dir t0=$SECONDS
    dir="$(mktemp -d "$reg/run/inst-$(date +%Y%m%d-%H%M%S)-XXXX")"
    chmod 700 "$dir"
    local p_plain p_auth p_tls
    free_port p_plain; free_port p_auth; free_port p_tls

    BATON_REGISTRY_AUTH_USER=baton
    BATON_REGISTRY_AUTH_PASSWORD="$(openssl rand -hex 12)"
    bcrypt_line "$BATON_REGISTRY_AUTH_USER" "$BATON_REGISTRY_AUTH_PASSWORD" >"$dir/htpasswd"
    chmod 600 "$dir/htpasswd"
    make_ca "$dir"
    write_config "$dir" plain "$p_plain"
    write_config "$dir" auth "$p_auth"
    write_config "$dir" tls "$p_tls"

    BATON_REGISTRY_PLAIN="127.0.0.1:$p_plain"
    BATON_REGISTRY_AUTH="127.0.0.1:$p_auth"
    BATON_REGISTRY_TLS="127.0.0.1:$p_tls"
    BATON_REGISTRY_CA="$dir/certs/ca.crt"
    BATON_REGISTRY_DIR="$dir"
    local mode pv
    for mode in "${modes[@]}"; do
        launch "$dir" "$mode"
        pv="$(pid_var "$mode")"
        printf -v "$pv" '%s' "$launched"
    done
    # Written before waiting, so that `stop` finds the processes even if the
    # wait below fails or is interrupted.
    write_env
    echo "$env_file" >"$dir/env-file"
    for mode in "${modes[@]}"; do up_or_die "$dir" "$mode"; done
    log "ready in $((SECONDS - t0))s: plain http://$BATON_REGISTRY_PLAIN, auth http://$BATON_REGISTRY_AUTH, tls https://$BATON_REGISTRY_TLS; env file: $env_file"
    cat "$env_file"
}

stop_pid() { # pid
    local i
    is_ours "$1" || return 0
    kill "$1" 2>/dev/null || true
    for i in $(seq 1 100); do
        is_ours "$1" || return 0
        sleep 0.1
    done
    log "docker-registry (pid $1) did not stop in 10s: killing it"
    kill -KILL "$1" 2>/dev/null || true
}

cmd_stop() {
    if ! read_env; then
        log "not running (no $env_file)"
        return 0
    fi
    local dir="$BATON_REGISTRY_DIR" mode
    stop_pid "$BATON_REGISTRY_PLAIN_PID"
    stop_pid "$BATON_REGISTRY_AUTH_PID"
    stop_pid "$BATON_REGISTRY_TLS_PID"
    # Storage, keys and passwords go now; the logs stay until the next start.
    if [ -d "$dir" ] && [[ "$dir" == "$reg"/run/inst-* ]]; then
        for mode in "${modes[@]}"; do rm -rf "${dir:?}/$mode"; done
        rm -rf "$dir/certs" "$dir/htpasswd"
        touch "$dir/stopped"
    fi
    rm -f "$env_file"
    log "stopped (pids $BATON_REGISTRY_PLAIN_PID, $BATON_REGISTRY_AUTH_PID, $BATON_REGISTRY_TLS_PID); logs in $dir"
}

cmd_status() {
    if ! read_env; then
        echo "not running (no $env_file)"
        return 1
    fi
    local mode pv ok=0 state
    for mode in "${modes[@]}"; do
        pv="$(pid_var "$mode")"
        state=stopped
        if is_ours "${!pv}"; then
            state="running (pid ${!pv})"
            wait_up "$mode" "$(addr_of "$mode")" "${!pv}" && state+=", answering" || ok=1
        else
            ok=1
        fi
        echo "$mode $(addr_of "$mode"): $state"
    done
    echo "(env file: $env_file)"
    return $ok
}

cmd_revive() {
    read_env || die "not running (no $env_file): start it first"
    local dir="$BATON_REGISTRY_DIR" mode pv
    [ -f "$dir/plain.yml" ] || die "$dir has no configuration: stop and start again"
    for mode in "${modes[@]}"; do
        pv="$(pid_var "$mode")"
        if ! is_ours "${!pv}"; then
            log "starting the $mode registry again on $(addr_of "$mode")"
            launch "$dir" "$mode"
            printf -v "$pv" '%s' "$launched"
            write_env
            up_or_die "$dir" "$mode"
        fi
    done
}

# ---------------------------------------------------------------- selftest

# check MODE: pushes a blob, a config and an OCI manifest with curl, pulls
# them back by tag and by digest, and compares digests.
check() {
    local mode="$1" addr scheme=http c=(curl -sS --max-time 10) repo_name=selftest/hello tmp
    addr="$(addr_of "$mode")"
    case "$mode" in
    tls) scheme=https c+=(--cacert "$BATON_REGISTRY_CA") ;;
    auth)
        local code
        code="$("${c[@]}" -o /dev/null -w '%{http_code}' "http://$addr/v2/")"
        [ "$code" = 401 ] || die "auth: /v2/ without credentials answered $code, not 401"
        log "auth: /v2/ without credentials: 401"
        c+=(-u "$BATON_REGISTRY_AUTH_USER:$BATON_REGISTRY_AUTH_PASSWORD")
        ;;
    esac
    local base="$scheme://$addr/v2/$repo_name"
    tmp="$(mktemp -d)"
    printf '\0asm\1\0\0\0selftest %s %s' "$mode" "$RANDOM" >"$tmp/layer"
    printf '{"architecture":"wasm","os":"wasip2","layerDigests":[]}' >"$tmp/config"
    local f dig loc dig_layer= dig_config=
    for f in layer config; do
        dig="sha256:$(sha256sum "$tmp/$f" | cut -d' ' -f1)"
        loc="$("${c[@]}" -f -X POST -o /dev/null -D - "$base/blobs/uploads/" | tr -d '\r' |
            sed -n 's/^[Ll]ocation: //p')"
        [ -n "$loc" ] || die "$mode: no upload location"
        case "$loc" in http*) ;; *) loc="$scheme://$addr$loc" ;; esac
        case "$loc" in *\?*) loc+="&digest=$dig" ;; *) loc+="?digest=$dig" ;; esac
        "${c[@]}" -f -X PUT -H 'Content-Type: application/octet-stream' --data-binary "@$tmp/$f" "$loc" -o /dev/null ||
            die "$mode: blob upload failed"
        printf -v "dig_$f" '%s' "$dig"
    done
    # shellcheck disable=SC2154
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.wasm.config.v0+json","digest":"%s","size":%d},"layers":[{"mediaType":"application/wasm","digest":"%s","size":%d}]}' \
        "$dig_config" "$(stat -c %s "$tmp/config")" "$dig_layer" "$(stat -c %s "$tmp/layer")" >"$tmp/manifest"
    local mdig pushed pulled
    mdig="sha256:$(sha256sum "$tmp/manifest" | cut -d' ' -f1)"
    pushed="$("${c[@]}" -f -X PUT -H 'Content-Type: application/vnd.oci.image.manifest.v1+json' \
        --data-binary "@$tmp/manifest" -D - -o /dev/null "$base/manifests/v1" | tr -d '\r' |
        sed -n 's/^[Dd]ocker-[Cc]ontent-[Dd]igest: //p')"
    [ "$pushed" = "$mdig" ] || die "$mode: manifest pushed as '$pushed', expected $mdig"
    "${c[@]}" -f -H 'Accept: application/vnd.oci.image.manifest.v1+json' "$base/manifests/v1" -o "$tmp/m1"
    "${c[@]}" -f -H 'Accept: application/vnd.oci.image.manifest.v1+json' "$base/manifests/$mdig" -o "$tmp/m2"
    cmp -s "$tmp/m1" "$tmp/manifest" && cmp -s "$tmp/m2" "$tmp/manifest" || die "$mode: pulled manifest differs"
    "${c[@]}" -f -L "$base/blobs/$dig_layer" -o "$tmp/pulled"
    pulled="sha256:$(sha256sum "$tmp/pulled" | cut -d' ' -f1)"
    [ "$pulled" = "$dig_layer" ] || die "$mode: pulled blob has digest $pulled, pushed $dig_layer"
    local code404
    code404="$("${c[@]}" -o /dev/null -w '%{http_code}' "$base/manifests/no-such-tag")"
    [ "$code404" = 404 ] || die "$mode: unknown tag answered $code404, not 404"
    log "$mode: pushed and pulled blob $dig_layer and manifest $mdig (tag v1), unknown tag 404"
    if [ "$mode" = tls ]; then
        if curl -sS --max-time 5 -o /dev/null "https://$addr/v2/" 2>/dev/null; then
            die "tls: the server was trusted without the test CA"
        fi
        log "tls: refused without the test CA, verified with $BATON_REGISTRY_CA"
    fi
    rm -rf "$tmp"
}

cmd_selftest() {
    read_env || die "not running (no $env_file): start it first"
    local mode
    for mode in "${modes[@]}"; do check "$mode"; done
    log "selftest passed"
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
revive) cmd_revive ;;
selftest) cmd_selftest ;;
*)
    echo "usage: $0 install|start|stop|status|revive|selftest" >&2
    exit 2
    ;;
esac
