#!/usr/bin/env bash
# A real PostgreSQL for tests, on loopback: Debian's postgresql-15 as a
# primary, an asynchronous streaming standby of it, and pgbouncer (transaction
# pooling) in front of the primary, each on a free port of 127.0.0.1, with
# TLS from a CA of the run's own.
#
#   scripts/pg-testenv.sh install          install Debian's postgresql-15, pgbouncer and
#                                          openssl (seconds when done)
#   scripts/pg-testenv.sh start            install, then start the primary, the standby and
#                                          the pooler; prints `export ...` lines, so
#                                          `eval "$(scripts/pg-testenv.sh start)"` works
#   scripts/pg-testenv.sh stop             stop all three (immediate) and delete their data;
#                                          safe to call twice
#   scripts/pg-testenv.sh status           says what runs (exit 0 if the primary does)
#   scripts/pg-testenv.sh stop NODE fast|immediate
#                                          pg_ctl stop -m of NODE (primary or standby)
#   scripts/pg-testenv.sh start-node NODE  starts NODE again, on the same port and data
#   scripts/pg-testenv.sh restart NODE fast|immediate
#   scripts/pg-testenv.sh pause NODE       SIGSTOP NODE's postmaster and all its children (the
#                                          whole server frozen); `resume NODE` sends SIGCONT
#   scripts/pg-testenv.sh terminate        pg_terminate_backend of every backend of user baton
#                                          on the primary; prints how many
#   scripts/pg-testenv.sh hold-replication SIGSTOP the standby's walreceiver (and the
#                                          primary's walsender feeding it), so the standby
#                                          falls behind; `release-replication` lets it go
#   scripts/pg-testenv.sh lag              prints the standby's replay LSN, the primary's
#                                          current LSN and the bytes between them
#   scripts/pg-testenv.sh failover         SIGKILL the primary (postmaster and children),
#                                          promote the standby, wait until it takes writes;
#                                          prints the new timeline id
#   scripts/pg-testenv.sh rebuild-standby  a fresh standby of the current primary by
#                                          pg_basebackup, on the other node's port (after a
#                                          failover: on the old primary's)
#   scripts/pg-testenv.sh psql [ARGS...]   psql as baton_admin on the current primary
#
# Every server process runs as the postgres OS user (PostgreSQL refuses root):
# by runuser when the caller is root, by `sudo -n -u postgres` when it is
# neither root nor postgres. Their run folder lives on tmpfs
# (/dev/shm/baton-pg-XXXXXXXX, owned by postgres), so that their fsyncs do
# not wait behind a build's dirty pages: node1/ and node2/ (the two data
# directories), node1.log, node2.log, pgbouncer.log, sock/ (unix sockets),
# pki/ (ca.crt, server.crt, server.key) and state (ports, passwords, which
# node is the primary). `stop` copies the logs to $BATON_CACHE/postgres/run/
# before deleting the folder. Debian's own cluster (15/main on port 5432) is
# never used.
#
# Roles: baton_admin (superuser), baton (owner of database baton),
# baton_limited (CONNECT on database baton, no CREATE on it nor on schema
# public), baton_replicator (REPLICATION). Password (SCRAM) over TCP; the
# pooler authenticates with the same SCRAM secrets (its auth_file is copied
# from pg_authid) and forwards them to the primary. The pooler follows the
# primary: `failover` points it at the promoted node.
#
# `start` writes an env file ($BATON_PG_ENV, default
# $BATON_CACHE/postgres/run/env.sh) that exports:
#   PG_TEST_PRIMARY_PORT, PG_TEST_STANDBY_PORT, PG_TEST_POOLER_PORT
#   PG_TEST_URL          postgres://baton:...@127.0.0.1:PRIMARY/baton
#   PG_TEST_ADMIN_URL    the same as baton_admin
#   PG_TEST_LIMITED_URL  the same as baton_limited
#   PG_TEST_STANDBY_URL  baton on the standby (read-only)
#   PG_TEST_FAILOVER_URL postgres://baton:...@127.0.0.1:PRIMARY,127.0.0.1:STANDBY/baton
#                        ?target_session_attrs=read-write
#   PG_TEST_POOLER_URL   baton through pgbouncer
#   PG_TEST_CA           the CA of the servers' certificate (CN and SAN 127.0.0.1,
#                        SAN localhost; every URL also works without TLS)
#   PG_TEST_DIR          the run folder; PG_TEST_PRIMARY_DATA, PG_TEST_STANDBY_DATA
#   PG_TEST_BIN          PostgreSQL's bin folder; PG_TEST_PSQL its psql
# `failover` and `rebuild-standby` rewrite it: the names primary and standby
# follow the roles, so PRIMARY_PORT and the URLs always name the node that
# takes writes (the set of ports in FAILOVER_URL never changes).
# One env file describes one environment: `start` refuses to replace a
# running one; give each concurrent environment its own BATON_PG_ENV. No PG*
# variable of the caller reaches libpq or the servers.
# shellcheck disable=SC2016,SC2034,SC2154
# (sh -c scripts take their arguments as $1...; the state and PG_TEST_*
# variables are read and written by name)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"

for v in $(compgen -e); do
    case "$v" in PG*) unset "$v" ;; esac
done

base="$BATON_CACHE/postgres"
env_file="${BATON_PG_ENV:-$base/run/env.sh}"
bin=/usr/lib/postgresql/15/bin
nodes=(node1 node2)

log() { echo "pg-testenv: $*" >&2; }
die() { echo "pg-testenv: error: $*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        die "needs root for: $*"
    fi
}

# Runs a command as the postgres OS user, from /, with postgres's home.
as_pg() {
    local home
    home="$(getent passwd postgres | cut -d: -f6)"
    if [ "$(id -un)" = postgres ]; then
        (cd / && "$@")
    elif [ "$(id -u)" -eq 0 ]; then
        (cd / && runuser -u postgres -- env HOME="$home" "$@")
    elif command -v sudo >/dev/null 2>&1; then
        (cd / && sudo -n -u postgres -- env HOME="$home" "$@")
    else
        die "needs root or sudo to run as postgres: $*"
    fi
}

# pg_out FILE CMD...: CMD as postgres, its output appended to FILE (in the run folder).
pg_out() { as_pg sh -c 'f="$1"; shift; exec "$@" </dev/null >>"$f" 2>&1' sh "$@"; }

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

cmd_install() {
    local missing=() p
    for p in postgresql-15 pgbouncer openssl; do
        installed "$p" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    mkdir -p "$base"
    exec 8>"$base/.install.lock"
    flock 8
    missing=()
    for p in postgresql-15 pgbouncer openssl; do
        installed "$p" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
        as_root apt-get update -q >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    fi
    # Debian's packages start servers of their own (a cluster 15/main on 5432,
    # a pgbouncer on 6432): not ours, never used.
    for p in "${missing[@]}"; do
        case "$p" in postgresql-15) p=postgresql ;; pgbouncer) ;; *) continue ;; esac
        if [ -d /run/systemd/system ]; then
            as_root systemctl disable --now "$p" >/dev/null 2>&1 || true
        else
            as_root service "$p" stop >/dev/null 2>&1 || true
        fi
    done
}

taken_ports=" "
# Ports from 12000 to 19999: apart from the other test servers' (20000 to
# 31999), whose members are started again on their old ports (etcd's and
# the API server's revive) and must not find them taken by a PostgreSQL
# started meanwhile; and below the kernel's ephemeral ports.
free_port() {
    local p i listening
    listening=" $(ss -Hltn 2>/dev/null | awk '{n=split($4,a,":"); print a[n]}' | tr '\n' ' ') "
    for i in $(seq 1 200); do
        p=$((12000 + RANDOM % 8000))
        case "$listening$taken_ports" in *" $p "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            taken_ports+="$p "
            printf -v "$1" '%s' "$p"
            return
        fi
    done
    die "found no free port"
}

# --- the env file and the run folder's state -------------------------------

state_vars=(primary standby stale held node1_port node2_port pooler_port pw_baton pw_admin pw_limited pw_repl)

read_env() {
    PG_TEST_DIR=
    [ -f "$env_file" ] || return 1
    # shellcheck disable=SC1090
    . "$env_file"
    [ -n "$PG_TEST_DIR" ]
}

# Loads the run folder's state (see state_vars); fails if the folder is gone.
load_state() {
    [ -n "${PG_TEST_DIR:-}" ] && [ -d "$PG_TEST_DIR" ] || return 1
    local text
    text="$(as_pg cat "$PG_TEST_DIR/state" 2>/dev/null)" || return 1
    eval "$text"
}

need_env() {
    read_env || die "no environment (no $env_file): run '$0 start' first"
    load_state || die "the environment of $env_file is gone ($PG_TEST_DIR): run '$0 stop', then '$0 start'"
}

save_state() {
    local v
    for v in "${state_vars[@]}"; do printf '%s=%q\n' "$v" "${!v}"; done |
        as_pg sh -c 'umask 077; cat >"$1.tmp" && mv "$1.tmp" "$1"' sh "$PG_TEST_DIR/state"
}

port_of() { local v="$1_port"; echo "${!v}"; }
data_of() { echo "$PG_TEST_DIR/$1"; }

# The env file, from the state: the names follow the roles.
write_env() {
    local p s pb
    p="$(port_of "$primary")" s="$(port_of "$standby")" pb="$pooler_port"
    PG_TEST_PRIMARY_PORT="$p" PG_TEST_STANDBY_PORT="$s" PG_TEST_POOLER_PORT="$pb"
    PG_TEST_URL="postgres://baton:$pw_baton@127.0.0.1:$p/baton"
    PG_TEST_ADMIN_URL="postgres://baton_admin:$pw_admin@127.0.0.1:$p/baton"
    PG_TEST_LIMITED_URL="postgres://baton_limited:$pw_limited@127.0.0.1:$p/baton"
    PG_TEST_STANDBY_URL="postgres://baton:$pw_baton@127.0.0.1:$s/baton"
    PG_TEST_FAILOVER_URL="postgres://baton:$pw_baton@127.0.0.1:$p,127.0.0.1:$s/baton?target_session_attrs=read-write"
    PG_TEST_POOLER_URL="postgres://baton:$pw_baton@127.0.0.1:$pb/baton"
    PG_TEST_CA="$PG_TEST_DIR/pki/ca.crt"
    PG_TEST_PRIMARY_DATA="$(data_of "$primary")" PG_TEST_STANDBY_DATA="$(data_of "$standby")"
    PG_TEST_BIN="$bin" PG_TEST_PSQL="$bin/psql"
    local vars=(PG_TEST_PRIMARY_PORT PG_TEST_STANDBY_PORT PG_TEST_POOLER_PORT PG_TEST_URL
        PG_TEST_ADMIN_URL PG_TEST_LIMITED_URL PG_TEST_STANDBY_URL PG_TEST_FAILOVER_URL
        PG_TEST_POOLER_URL PG_TEST_CA PG_TEST_DIR PG_TEST_PRIMARY_DATA PG_TEST_STANDBY_DATA
        PG_TEST_BIN PG_TEST_PSQL) v
    mkdir -p "$(dirname "$env_file")"
    (
        umask 077
        for v in "${vars[@]}"; do printf 'export %s=%q\n' "$v" "${!v}"; done >"$env_file.tmp"
    )
    mv "$env_file.tmp" "$env_file"
}

# q URL SQL: one query by psql (as the caller), its rows unaligned.
q() { PGCONNECT_TIMEOUT=5 "$bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }

# The admin URL of node ID (database baton).
admin_url() { echo "postgres://baton_admin:$pw_admin@127.0.0.1:$(port_of "$1")/baton"; }

# --- processes -------------------------------------------------------------

# Is $1 a live (not zombie) process whose command line has the word $2?
proc_has() {
    [ -r "/proc/$1/cmdline" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ] &&
        tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -qxF -- "$2"
}

# pm_pid ID: the pid of node ID's postmaster, if it runs (paused or not).
pm_pid() {
    local d p
    d="$(data_of "$1")"
    p="$(as_pg head -n 1 "$d/postmaster.pid" 2>/dev/null)" || return 1
    case "$p" in '' | *[!0-9]*) return 1 ;; esac
    proc_has "$p" "$d" || return 1
    echo "$p"
}

children() { ps -o pid= --ppid "$1" 2>/dev/null | tr -d ' ' || true; }
is_paused() { [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = T ]; }
signal() { as_pg kill "-$1" "${@:2}" 2>/dev/null || true; }

pooler_pid() {
    local p
    p="$(as_pg cat "$PG_TEST_DIR/pgbouncer.pid" 2>/dev/null)" || return 1
    case "$p" in '' | *[!0-9]*) return 1 ;; esac
    proc_has "$p" "$PG_TEST_DIR/pgbouncer.ini" || return 1
    echo "$p"
}

# The walreceiver of node ID (a standby), the walsender feeding it on node PID.
child_with() { # PM PATTERN
    ps -o pid=,args= --ppid "$1" 2>/dev/null | awk -v pat="$2" '$0 ~ pat {print $1; exit}'
}

wait_gone() { # PID...
    local i p any
    for i in $(seq 1 100); do
        any=0
        for p in "$@"; do
            [ -e "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] && any=1
        done
        [ "$any" = 0 ] && return 0
        sleep 0.1
    done
    return 1
}

# Lets the held walreceiver and walsender go (and forgets them).
release_held() {
    [ -n "$held" ] || return 0
    # shellcheck disable=SC2086
    signal CONT $held
    held=
    save_state
}

# node_stop ID MODE: pg_ctl stop -m MODE (SIGKILL if it does not stop in 30 s).
node_stop() {
    local id="$1" mode="$2" pm kids
    pm="$(pm_pid "$id")" || return 0
    kids="$(children "$pm")"
    # A frozen server, or a frozen walreceiver or walsender, would never stop.
    release_held
    # shellcheck disable=SC2086
    signal CONT "$pm" $kids
    if ! pg_out "$PG_TEST_DIR/$id.log" "$bin/pg_ctl" -D "$(data_of "$id")" -m "$mode" -w -t 30 stop; then
        log "$id did not stop ($mode) in 30 s: SIGKILL"
        # shellcheck disable=SC2086
        signal KILL "$pm" $kids
        # shellcheck disable=SC2086
        wait_gone "$pm" $kids || true
        after_kill "$id" "$pm"
    fi
    # shellcheck disable=SC2086
    wait_gone "$pm" $kids || true
}

# node_kill ID: SIGKILL the postmaster and all its children at once.
node_kill() {
    local id="$1" pm kids
    pm="$(pm_pid "$id")" || return 0
    kids="$(children "$pm")"
    # shellcheck disable=SC2086
    signal KILL "$pm" $kids
    # shellcheck disable=SC2086
    wait_gone "$pm" $kids || die "$id (pid $pm) survives SIGKILL"
    after_kill "$id" "$pm"
}

# after_kill ID PM: what node ID's SIGKILLed postmaster PM leaves behind. Its
# System V shared memory segment (the rest is mmap'd in the data directory).
# Its lock files: the pid in them may stay a zombie for a while (until init
# reaps it: about a second here), and a zombie's pid looks alive to the next
# postmaster on that port or data directory, which then refuses to start.
after_kill() {
    local shm
    ipcs -m -p 2>/dev/null | awk -v pm="$2" '$3 == pm {print $1}' | while read -r shm; do
        as_pg ipcrm -m "$shm" 2>/dev/null || true
    done
    as_pg rm -f "$PG_TEST_DIR/sock/.s.PGSQL.$(port_of "$1").lock" "$PG_TEST_DIR/sock/.s.PGSQL.$(port_of "$1")" \
        "$(data_of "$1")/postmaster.pid"
}

node_start() { # ID
    local id="$1"
    pg_out "$PG_TEST_DIR/$id.log" "$bin/pg_ctl" -D "$(data_of "$id")" -l "$PG_TEST_DIR/$id.log" -w -t 60 start ||
        { tail -n 20 "$PG_TEST_DIR/$id.log" >&2 2>/dev/null || true; die "$id did not start (log: $PG_TEST_DIR/$id.log)"; }
    wait_ready "$id"
}

# Until node ID accepts connections (as baton_admin, by TCP).
wait_ready() {
    local id="$1" t0=$SECONDS
    while [ $((SECONDS - t0)) -lt 60 ]; do
        q "$(admin_url "$id")" 'SELECT 1' >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "$id accepts no connection after 60 s (log: $PG_TEST_DIR/$id.log)"
}

# Until standby ID streams from the primary.
wait_streaming() {
    local id="$1" t0=$SECONDS
    while [ $((SECONDS - t0)) -lt 60 ]; do
        [ "$(q "$(admin_url "$id")" "SELECT status FROM pg_stat_wal_receiver" 2>/dev/null)" = streaming ] && return 0
        sleep 0.1
    done
    die "$id does not stream from the primary after 60 s (log: $PG_TEST_DIR/$id.log)"
}

# --- building the nodes ----------------------------------------------------

# A CA, and a server certificate for 127.0.0.1 and localhost signed by it, in the run's pki/.
make_pki() {
    as_pg sh -c '
        set -e
        cd "$1"
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=baton postgres test CA" \
            -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
            -keyout ca.key -out ca.crt 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout server.key -out server.csr 2>/dev/null
        printf "%s\n" "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
            "extendedKeyUsage=serverAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost" >server.ext
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
            -extfile server.ext -out server.crt 2>/dev/null
        chmod 600 ca.key server.key
        chmod 644 ca.crt server.crt
    ' sh "$PG_TEST_DIR/pki"
}

init_primary() { # ID
    local id="$1" d
    d="$(data_of "$id")"
    pg_out "$PG_TEST_DIR/setup.log" "$bin/initdb" -D "$d" -U postgres -E UTF8 --locale=C \
        --auth-local=peer --auth-host=scram-sha-256 ||
        { tail -n 20 "$PG_TEST_DIR/setup.log" >&2; die "initdb failed"; }
    as_pg sh -c 'cat >>"$1/postgresql.conf"' sh "$d" <<EOF

# scripts/pg-testenv.sh
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PG_TEST_DIR/sock'
max_connections = 200
shared_buffers = 64MB
dynamic_shared_memory_type = mmap
password_encryption = 'scram-sha-256'
ssl = on
ssl_cert_file = '$PG_TEST_DIR/pki/server.crt'
ssl_key_file = '$PG_TEST_DIR/pki/server.key'
fsync = on
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
wal_keep_size = '64MB'
hot_standby = on
synchronous_standby_names = ''
wal_retrieve_retry_interval = '1s'
log_line_prefix = '%m [%p] %q%u@%d '
log_connections = on
log_disconnections = on
EOF
    set_port "$id"
    as_pg sh -c 'cat >"$1/pg_hba.conf"' sh "$d" <<'EOF'
# scripts/pg-testenv.sh: peer for the postgres OS user on the socket,
# SCRAM passwords on the socket and on TCP (with or without TLS).
local   all          postgres                  peer
local   replication  postgres                  peer
local   all          all                       scram-sha-256
host    all          all          127.0.0.1/32 scram-sha-256
host    replication  baton_replicator 127.0.0.1/32 scram-sha-256
EOF
    node_start_socket "$id"
    as_pg "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$PG_TEST_DIR/sock" -p "$(port_of "$id")" -U postgres -d postgres \
        >>/dev/null <<EOF
CREATE ROLE baton_admin LOGIN SUPERUSER PASSWORD '$pw_admin';
CREATE ROLE baton LOGIN PASSWORD '$pw_baton';
CREATE ROLE baton_limited LOGIN PASSWORD '$pw_limited';
CREATE ROLE baton_replicator LOGIN REPLICATION PASSWORD '$pw_repl';
CREATE DATABASE baton OWNER baton;
REVOKE ALL ON DATABASE baton FROM PUBLIC;
GRANT CONNECT ON DATABASE baton TO baton_limited;
\connect baton
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO baton_limited;
EOF
}

# The port of node ID in its own postgresql.conf (a base backup copies the primary's).
set_port() {
    as_pg sh -c 'sed -i "/^port = /d" "$1/postgresql.conf" && echo "port = $2" >>"$1/postgresql.conf"' \
        sh "$(data_of "$1")" "$(port_of "$1")"
}

# Starts node ID and waits for it on its unix socket (before the roles exist).
node_start_socket() {
    local id="$1"
    pg_out "$PG_TEST_DIR/$id.log" "$bin/pg_ctl" -D "$(data_of "$id")" -l "$PG_TEST_DIR/$id.log" -w -t 60 start ||
        { tail -n 20 "$PG_TEST_DIR/$id.log" >&2 2>/dev/null || true; die "$id did not start (log: $PG_TEST_DIR/$id.log)"; }
}

# make_standby ID: node ID, a new standby of the primary (replication slot baton_ID).
make_standby() {
    local id="$1" d purl
    d="$(data_of "$id")"
    purl="$(admin_url "$primary")"
    as_pg rm -rf "$d"
    # A slot of the same name left by an earlier standby on this port.
    for _ in $(seq 1 50); do
        [ "$(q "$purl" "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'baton_$id'")" = 0 ] && break
        q "$purl" "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
                   WHERE slot_name = 'baton_$id' AND active_pid IS NOT NULL" >/dev/null 2>&1 || true
        q "$purl" "SELECT pg_drop_replication_slot('baton_$id')" >/dev/null 2>&1 || true
        sleep 0.1
    done
    pg_out "$PG_TEST_DIR/setup.log" "$bin/pg_basebackup" -D "$d" -R -X stream -c fast -C -S "baton_$id" \
        -d "host=127.0.0.1 port=$(port_of "$primary") user=baton_replicator password=$pw_repl application_name=baton_$id" ||
        { tail -n 20 "$PG_TEST_DIR/setup.log" >&2; die "pg_basebackup of $id failed"; }
    set_port "$id"
    node_start "$id"
    wait_streaming "$id"
}

# pgbouncer's configuration, in front of the current primary; reloaded if it runs.
pooler_config() {
    local pb
    as_pg sh -c 'cat >"$1/pgbouncer.ini.tmp" && mv "$1/pgbouncer.ini.tmp" "$1/pgbouncer.ini"' sh "$PG_TEST_DIR" <<EOF
; scripts/pg-testenv.sh: in front of the primary ($primary)
[databases]
* = host=127.0.0.1 port=$(port_of "$primary")

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $pooler_port
unix_socket_dir = $PG_TEST_DIR/sock
pool_mode = transaction
auth_type = scram-sha-256
auth_file = $PG_TEST_DIR/pgbouncer.users
admin_users = baton_admin
stats_users = baton_admin
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits
client_tls_sslmode = allow
client_tls_key_file = $PG_TEST_DIR/pki/server.key
client_tls_cert_file = $PG_TEST_DIR/pki/server.crt
client_tls_ca_file = $PG_TEST_DIR/pki/ca.crt
server_tls_sslmode = disable
logfile = $PG_TEST_DIR/pgbouncer.log
pidfile = $PG_TEST_DIR/pgbouncer.pid
EOF
    if pb="$(pooler_pid)"; then signal HUP "$pb"; fi
}

start_pooler() {
    # The SCRAM secrets of the login roles, as the primary keeps them.
    q "$(admin_url "$primary")" "SELECT '\"' || rolname || '\" \"' || rolpassword || '\"' FROM pg_authid
        WHERE rolname IN ('baton', 'baton_admin', 'baton_limited') ORDER BY 1" |
        as_pg sh -c 'umask 077; cat >"$1"' sh "$PG_TEST_DIR/pgbouncer.users"
    pooler_config
    pg_out "$PG_TEST_DIR/pgbouncer.log" /usr/sbin/pgbouncer -d -q "$PG_TEST_DIR/pgbouncer.ini" ||
        { tail -n 20 "$PG_TEST_DIR/pgbouncer.log" >&2 2>/dev/null || true; die "pgbouncer did not start"; }
    local t0=$SECONDS
    while [ $((SECONDS - t0)) -lt 30 ]; do
        q "$PG_TEST_POOLER_URL" 'SELECT 1' >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    q "$PG_TEST_POOLER_URL" 'SELECT 1' >&2 || true
    die "pgbouncer accepts no connection after 30 s (log: $PG_TEST_DIR/pgbouncer.log)"
}

# --- commands --------------------------------------------------------------

any_running() {
    local id
    for id in "${nodes[@]}"; do pm_pid "$id" >/dev/null && return 0; done
    pooler_pid >/dev/null
}

on_start_exit() {
    [ "${starting:-0}" = 1 ] || return 0
    log "start failed: stopping what it started"
    cmd_stop >/dev/null || true
}

cmd_start() {
    cmd_install
    if read_env; then
        if load_state && any_running; then
            die "an environment of $env_file runs already ($PG_TEST_DIR): stop it first"
        fi
        cmd_stop 2>/dev/null || true
    fi
    local t0 shm=/dev/shm
    t0="$(date +%s.%N)"
    [ -d "$shm" ] && [ -w "$shm" ] || shm=/tmp
    mkdir -p "$base/run"
    # The logs that `stop` kept, an hour old or more.
    find "$base/run" -mindepth 1 -maxdepth 1 -name 'baton-pg-*' -type d -mmin +60 -exec rm -rf '{}' + 2>/dev/null || true
    starting=1
    trap on_start_exit EXIT
    PG_TEST_DIR="$(as_pg mktemp -d -p "$shm" baton-pg-XXXXXXXX)"
    as_pg chmod 755 "$PG_TEST_DIR"
    as_pg mkdir -m 755 "$PG_TEST_DIR/sock" "$PG_TEST_DIR/pki"
    free_port node1_port
    free_port node2_port
    free_port pooler_port
    primary=node1 standby=node2 stale='' held=''
    pw_baton="$(openssl rand -hex 16)" pw_admin="$(openssl rand -hex 16)"
    pw_limited="$(openssl rand -hex 16)" pw_repl="$(openssl rand -hex 16)"
    save_state
    # Written before the servers start: `stop` works after a failed start.
    write_env
    make_pki
    init_primary node1
    wait_ready node1
    make_standby node2
    start_pooler
    # Each URL, as the tests will use it.
    local u
    for u in PG_TEST_URL PG_TEST_LIMITED_URL PG_TEST_FAILOVER_URL; do
        q "${!u}" 'SELECT 1' >/dev/null || die "no connection by $u"
    done
    starting=0
    log "primary on $PG_TEST_PRIMARY_PORT, standby on $PG_TEST_STANDBY_PORT, pgbouncer on $PG_TEST_POOLER_PORT;" \
        "started in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s; env in $env_file"
    cat "$env_file"
}

cmd_stop() {
    read_env || return 0
    if load_state; then
        local id pb shm
        for id in "${nodes[@]}"; do
            node_stop "$id" immediate
            # A node killed by someone else leaves its System V segment (its id
            # is on line 7 of postmaster.pid): removed once nothing attaches it.
            shm="$(as_pg sed -n '7{s/^ *[0-9]* *//;p}' "$(data_of "$id")/postmaster.pid" 2>/dev/null || true)"
            case "$shm" in '' | *[!0-9]*) ;; *)
                if [ "$(ipcs -m -i "$shm" 2>/dev/null | awk -F= '/nattch/ {gsub(/ /, "", $NF); print $NF}')" = 0 ]; then
                    as_pg ipcrm -m "$shm" 2>/dev/null || true
                fi ;;
            esac
        done
        if pb="$(pooler_pid)"; then
            signal TERM "$pb"
            wait_gone "$pb" || signal KILL "$pb"
        fi
    fi
    case "$(basename "$PG_TEST_DIR")" in baton-pg-*) ;; *) die "$env_file names $PG_TEST_DIR, not a run folder of this script" ;; esac
    if [ -d "$PG_TEST_DIR" ]; then
        local keep f
        keep="$base/run/$(basename "$PG_TEST_DIR")"
        mkdir -p "$keep"
        for f in node1.log node2.log pgbouncer.log setup.log; do
            as_pg cat "$PG_TEST_DIR/$f" >"$keep/$f" 2>/dev/null || rm -f "$keep/$f"
        done
        as_pg rm -rf "$PG_TEST_DIR"
        log "stopped; logs in $keep"
    fi
    rm -f "$env_file"
}

# node_id NAME: the id (node1, node2) that primary or standby names now.
node_id() {
    case "${1:-}" in
    primary) echo "$primary" ;;
    standby) echo "$standby" ;;
    *) die "a node is primary or standby, not '${1:-}'" ;;
    esac
}

mode_arg() {
    case "${1:-}" in fast | immediate) echo "$1" ;; *) die "a stop mode is fast or immediate, not '${1:-}'" ;; esac
}

node_state() { # ID
    local pm
    if [ "$1" = "$stale" ]; then
        echo "down (the old primary: rebuild-standby makes it a standby again)"
    elif pm="$(pm_pid "$1")"; then
        if is_paused "$pm"; then echo "paused (pid $pm)"; else echo "running (pid $pm)"; fi
    else
        echo "down"
    fi
}

cmd_status() {
    read_env || { echo "not started"; return 1; }
    load_state || { echo "gone ($PG_TEST_DIR)"; return 1; }
    local pb
    echo "primary: $primary on port $(port_of "$primary"), $(node_state "$primary")"
    echo "standby: $standby on port $(port_of "$standby"), $(node_state "$standby")"
    if pb="$(pooler_pid)"; then echo "pooler: port $pooler_port, running (pid $pb)"; else echo "pooler: port $pooler_port, down"; fi
    [ -z "$held" ] || echo "replication: held (pids $held)"
    pm_pid "$primary" >/dev/null
}

cmd_stop_node() { # NAME MODE
    need_env
    local id mode
    id="$(node_id "$1")" mode="$(mode_arg "${2:-}")"
    pm_pid "$id" >/dev/null || { log "$1 ($id) is not running"; return 0; }
    node_stop "$id" "$mode"
    log "stopped $1 ($id, port $(port_of "$id")) -m $mode"
}

cmd_start_node() { # NAME
    need_env
    local id
    id="$(node_id "${1:-}")"
    [ "$id" != "$stale" ] || die "$1 ($id) is the old primary of a failover: '$0 rebuild-standby' makes it a standby"
    if pm_pid "$id" >/dev/null; then log "$1 ($id) runs already"; return 0; fi
    node_start "$id"
    log "started $1 ($id) on port $(port_of "$id")"
}

cmd_restart_node() { # NAME MODE
    need_env
    local id mode
    id="$(node_id "${1:-}")" mode="$(mode_arg "${2:-}")"
    [ "$id" != "$stale" ] || die "$1 ($id) is the old primary of a failover: '$0 rebuild-standby' makes it a standby"
    node_stop "$id" "$mode"
    node_start "$id"
    log "restarted $1 ($id) on port $(port_of "$id") (-m $mode)"
}

cmd_pause() { # SIGNAL NAME
    need_env
    local id pm kids p
    id="$(node_id "${2:-}")"
    pm="$(pm_pid "$id")" || die "$2 ($id) is not running"
    kids="$(children "$pm")"
    if [ "$1" = STOP ]; then
        # The postmaster first, so that it sees no child stop.
        signal STOP "$pm"
        # shellcheck disable=SC2086
        [ -z "$kids" ] || signal STOP $kids
        log "paused $2 ($id): postmaster $pm and $(wc -w <<<"$kids") children"
    else
        # A held walreceiver or walsender stays held.
        for p in $kids; do
            case " $held " in *" $p "*) continue ;; esac
            signal CONT "$p"
        done
        signal CONT "$pm"
        log "resumed $2 ($id)"
    fi
}

cmd_terminate() {
    need_env
    local n
    n="$(q "$(admin_url "$primary")" "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
        FROM pg_stat_activity WHERE usename = 'baton' AND pid <> pg_backend_pid()")" ||
        die "the primary ($primary) does not answer"
    log "terminated $n backends of baton on the primary ($primary)"
    echo "$n"
}

cmd_hold() {
    need_env
    [ -z "$held" ] || { log "replication is held already (pids $held)"; return 0; }
    local spm ppm rcv snd
    spm="$(pm_pid "$standby")" || die "the standby ($standby) is not running"
    rcv="$(child_with "$spm" 'walreceiver')"
    [ -n "$rcv" ] || die "the standby ($standby) has no walreceiver (not streaming)"
    snd=
    if ppm="$(pm_pid "$primary")"; then snd="$(child_with "$ppm" 'walsender baton_replicator')"; fi
    # The sender first: a frozen receiver alone lets the sender fill the
    # socket buffers, which the receiver would still apply when let go.
    # shellcheck disable=SC2086
    signal STOP $snd $rcv
    held="$rcv${snd:+ $snd}"
    save_state
    log "replication held: walreceiver $rcv of $standby${snd:+, walsender $snd of $primary} stopped"
}

cmd_release() {
    need_env
    [ -n "$held" ] || { log "replication is not held"; return 0; }
    local h="$held"
    release_held
    log "replication released (pids $h)"
}

cmd_lag() {
    need_env
    local s p d
    s="$(q "$(admin_url "$standby")" 'SELECT pg_last_wal_replay_lsn()')" || die "the standby ($standby) does not answer"
    p="$(q "$(admin_url "$primary")" 'SELECT pg_current_wal_lsn()')" || die "the primary ($primary) does not answer"
    d="$(q "$(admin_url "$primary")" "SELECT pg_wal_lsn_diff('$p', '$s')::bigint")"
    echo "standby_replay=$s primary_current=$p bytes_behind=$d"
}

# The timeline of node ID's current WAL (a primary's), as a number.
timeline() {
    local t
    t="$(q "$(admin_url "$1")" 'SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)')" || return 1
    echo $((16#$t))
}

cmd_failover() {
    need_env
    [ "$standby" != "$stale" ] || die "the standby ($standby) is the old primary of a failover: '$0 rebuild-standby' first"
    local old="$primary" new="$standby" t0=$SECONDS tl port pm
    pm_pid "$new" >/dev/null || die "the standby ($new) is not running"
    node_kill "$old"
    if [ -n "$held" ]; then
        # Its walsender died with the primary: nothing of the held WAL is in flight.
        release_held
    fi
    pm="$(pm_pid "$new")"
    is_paused "$pm" && cmd_pause CONT standby
    pg_out "$PG_TEST_DIR/$new.log" "$bin/pg_ctl" -D "$(data_of "$new")" -w -t 60 promote ||
        die "promoting $new failed (log: $PG_TEST_DIR/$new.log)"
    while [ "$(q "$(admin_url "$new")" 'SELECT pg_is_in_recovery()' 2>/dev/null)" != f ]; do
        [ $((SECONDS - t0)) -lt 60 ] || die "$new takes no writes 60 s after its promotion"
        sleep 0.1
    done
    primary="$new" standby="$old" stale="$old"
    save_state
    write_env
    pooler_config
    port="$(q "$PG_TEST_FAILOVER_URL" 'SELECT inet_server_port()')" || die "no read-write connection by PG_TEST_FAILOVER_URL"
    [ "$port" = "$(port_of "$new")" ] || die "PG_TEST_FAILOVER_URL reaches port $port, not the new primary's"
    tl="$(timeline "$new")"
    log "failover: $new (port $(port_of "$new")) is the primary, on timeline $tl; $old is down"
    echo "$tl"
}

cmd_rebuild() {
    need_env
    local id="$standby"
    pm_pid "$primary" >/dev/null || die "the primary ($primary) is not running"
    [ "$(q "$(admin_url "$primary")" 'SELECT pg_is_in_recovery()')" = f ] || die "the primary ($primary) is in recovery"
    release_held
    node_kill "$id"
    make_standby "$id"
    stale=
    save_state
    write_env
    pooler_config
    log "rebuilt the standby: $id on port $(port_of "$id"), streaming from $primary (port $(port_of "$primary"))"
}

cmd_psql() {
    need_env
    exec "$bin/psql" "$(admin_url "$primary")" "$@"
}

usage="install|start|stop|status|stop NODE fast|immediate|start-node NODE|restart NODE fast|immediate|pause NODE|resume NODE|terminate|hold-replication|release-replication|lag|failover|rebuild-standby|psql [ARGS...] (NODE: primary or standby)"
case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
stop) if [ $# -ge 2 ]; then cmd_stop_node "$2" "${3:-}"; else cmd_stop; fi ;;
status) cmd_status ;;
start-node) cmd_start_node "${2:-}" ;;
restart) cmd_restart_node "${2:-}" "${3:-}" ;;
pause) cmd_pause STOP "${2:-}" ;;
resume) cmd_pause CONT "${2:-}" ;;
terminate) cmd_terminate ;;
hold-replication) cmd_hold ;;
release-replication) cmd_release ;;
lag) cmd_lag ;;
failover) cmd_failover ;;
rebuild-standby) cmd_rebuild ;;
psql) shift; cmd_psql "$@" ;;
*) die "usage: $0 $usage" ;;
esac
