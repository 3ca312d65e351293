#!/usr/bin/env bash
# Proves an image archive made by scripts/image.sh against a real API server
# (scripts/kube-testenv.sh): the image's host, run from the archive as user
# 65532 with the image's own configuration (deploy/kubernetes/configmap.yaml's)
# and nothing of this machine's environment, takes part in one election with
# a host outside the image (this checkout's debug `baton`, running the
# plugins taken out of the image):
#
#   1. the archive is a valid OCI image (umoci unpacks it, checking every
#      digest; skopeo reads it); its config runs `baton run` as 65532:65532
#      with BATON_CONFIG and BATON_CACHE_DIR set; its binary is static;
#   2. `baton check` in the image passes for the image's plugins;
#   3. the image's host (A) leads the lease `demo`, its plugins tick, its
#      /readyz answers 200; the outside host (O) follows;
#   4. SIGTERM to A: A exits 0 having released the lease, O takes over at
#      once (a higher term) and its plugins tick;
#   5. a second image host (B) follows O; SIGTERM to O: B takes over;
#   6. SIGTERM to B: it exits 0.
#
#   scripts/image-test.sh [ARCHIVE]
#
# ARCHIVE defaults to scripts/image.sh's. The image runs under podman (with
# runc: crun refuses this kind of machine's hybrid cgroups) if podman can run
# it here, else from the archive's root file system unpacked, in a mount
# namespace of its own, chroot'ed as 65532:65532 with only the image's
# environment (BATON_IMAGE_RUNNER=podman|rootfs forces one). Both hosts use
# the test user baton-a, bound to the Role of deploy/kubernetes by
# deploy/kubernetes/verify.sh (run first), in namespace baton. The outside
# host is $BATON_OUTSIDE_BATON, default $CARGO_TARGET_DIR/debug/baton (built
# if missing). The API server is started under BATON_KUBE_ENV (default
# $BATON_CACHE/kube/run/test-image.env) and stopped at the end. Installs
# umoci, skopeo and podman with runc (apt-get, root) when missing.
# Exits 0 and prints "image-test: N passed, 0 failed" if everything holds.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"
cd "$repo"

version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)"
name="${BATON_IMAGE_NAME:-baton}"
tag="${BATON_IMAGE_TAG:-$version}"
archive="${1:-$BATON_CACHE/image/$name-$tag.oci.tar}"
runner="${BATON_IMAGE_RUNNER:-auto}"
outside_bin="${BATON_OUTSIDE_BATON:-$CARGO_TARGET_DIR/debug/baton}"
export BATON_KUBE_ENV="${BATON_KUBE_ENV:-$BATON_CACHE/kube/run/test-image.env}"
ns=baton
lease=demo

log() { echo "image-test: $*" >&2; }
die() { echo "image-test: error: $*" >&2; exit 1; }
passed=0
pass() { passed=$((passed + 1)); log "ok: $*"; }
fail() {
    local f
    log "FAIL: $*"
    for f in "${work:-/nonexistent}"/*.log; do
        [ -f "$f" ] || continue
        echo "----- last lines of $(basename "$f")" >&2
        tail -n 15 "$f" >&2
    done
    echo "image-test: $passed passed, 1 failed" >&2
    exit 1
}

[ -f "$archive" ] || die "no archive $archive (build it with scripts/image.sh)"
archive="$(cd "$(dirname "$archive")" && pwd)/$(basename "$archive")"

# ---- install
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
pkgs=(umoci skopeo)
[ "$runner" = rootfs ] || pkgs+=(podman runc)
missing=()
for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "install ${missing[*]} (apt-get; needs root)"
    log "apt-get install ${missing[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    fi
fi
if [ ! -x "$outside_bin" ]; then
    [ -z "${BATON_OUTSIDE_BATON:-}" ] || die "no $outside_bin"
    cargo build -p baton --features test-hooks >&2
fi

mkdir -p "$BATON_CACHE/image"
work="$(mktemp -d "$BATON_CACHE/image/test.XXXXXX")"
chmod 755 "$work"
pids=()
declare -A container_of=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    if [ -n "${podman_ok:-}" ]; then
        "${P[@]}" rm --force --all >/dev/null 2>&1 || true
        "${P[@]}" rmi --all --force >/dev/null 2>&1 || true
    fi
    scripts/kube-testenv.sh stop >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- 1. the archive
mkdir "$work/layout"
tar -xf "$archive" -C "$work/layout"
umoci unpack --image "$work/layout:$name:$tag" "$work/bundle" >&2 ||
    fail "umoci cannot unpack $name:$tag from $archive"
rootfs="$work/bundle/rootfs"
config="$(skopeo inspect --config "oci-archive:$archive:$name:$tag")" || fail "skopeo cannot read $archive"
size_kib="$(du -k "$archive" | cut -f1)"
unpacked_kib="$(du -sk "$rootfs" | cut -f1)"
grep -q '"User": "65532:65532"' <<<"$config" || fail "the image's user is not 65532:65532"
grep -q '"BATON_CONFIG=/etc/baton/baton.toml"' <<<"$config" || fail "the image sets no BATON_CONFIG"
grep -q '"BATON_CACHE_DIR=/var/cache/baton/compiled"' <<<"$config" || fail "the image sets no BATON_CACHE_DIR"
[ -x "$rootfs/usr/local/bin/baton" ] || fail "no /usr/local/bin/baton in the image"
! readelf -l "$rootfs/usr/local/bin/baton" | grep -q 'program interpreter' || fail "the image's baton is not static"
[ "$(stat -c %u:%a "$rootfs/var/cache/baton")" = 65532:700 ] || fail "/var/cache/baton is not 65532's"
[ "$(stat -c %a "$rootfs/tmp")" = 1777 ] || fail "/tmp is not mode 1777"
mapfile -t plugins < <(cd "$rootfs" && ls opt/baton/plugins/*.wasm | sed 's|^|/|')
[ ${#plugins[@]} -ge 2 ] || fail "fewer than two plugins in /opt/baton/plugins"
pass "$archive: a valid OCI image ($size_kib KiB, $unpacked_kib KiB unpacked), user 65532, static baton, plugins ${plugins[*]}"

# ---- the runner
P=(podman --root "$work/podman/root" --runroot "$work/podman/run" --storage-driver vfs --cgroup-manager cgroupfs)
command -v runc >/dev/null && P+=(--runtime runc)
# Limits of our own: podman's defaults (above this machine's hard limit)
# are refused here.
run_opts=(--network host --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 -v "$work/mnt:/etc/baton-test:ro")
image_env=()
while IFS= read -r e; do image_env+=("$e"); done < <(sed -n 's/^ *"\(BATON_[A-Z_]*=[^"]*\)",\{0,1\}$/\1/p' <<<"$config")
mkdir -p "$work/mnt" "$rootfs/proc" "$rootfs/dev" "$rootfs/etc/baton-test"
chmod 755 "$work/mnt"
podman_ok=
if [ "$runner" != rootfs ]; then
    if "${P[@]}" load -q -i "$archive" >&2 && out="$("${P[@]}" run --rm "${run_opts[@]}" "localhost/$name:$tag" --version 2>&1)"; then
        podman_ok=1
        runner=podman
        log "running the image under podman ($out)"
    elif [ "$runner" = podman ]; then
        die "podman cannot run the image here: $out"
    else
        log "podman cannot run the image here (${out:-load failed}): running it from its root file system"
    fi
fi
[ -n "$podman_ok" ] || runner=rootfs
if [ "$runner" = rootfs ]; then
    [ "$(id -u)" = 0 ] || die "running from the root file system needs root (unshare, chroot)"
fi

# in_image LOG ENV... -- ARGS...: runs baton in the image in the background
# (its pid in $last_pid), extra environment ENV.
in_image() {
    local out="$1" envs=() e
    shift
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    if [ "$runner" = podman ]; then
        local eargs=()
        for e in "${envs[@]}"; do eargs+=(-e "$e"); done
        last_name="baton-image-test-$$-$RANDOM"
        "${P[@]}" run --rm --name "$last_name" "${run_opts[@]}" "${eargs[@]}" \
            "localhost/$name:$tag" "$@" </dev/null >"$out" 2>&1 &
    else
        cp "$work/mnt/"* "$rootfs/etc/baton-test/" 2>/dev/null || true
        # Nothing of this environment: the image's variables and ENV only,
        # no HOME, no TMPDIR; its own /tmp, /proc and /dev.
        env -i "${image_env[@]}" "${envs[@]}" \
            unshare --mount --fork -- /bin/sh -c \
            'mount --rbind /dev "$0/dev" && mount -t proc proc "$0/proc" && exec chroot --userspec=65532:65532 "$0" /usr/local/bin/baton "$@"' \
            "$rootfs" "$@" </dev/null >"$out" 2>&1 &
    fi
    last_pid=$!
    pids+=("$last_pid")
    [ "$runner" != podman ] || container_of[$last_pid]="$last_name"
}

# The pid of the baton process itself (to signal), for a pid of in_image.
baton_pid() {
    if [ "$runner" = podman ]; then
        # The container's first process, runc's init exec'ed into baton.
        "${P[@]}" inspect --format '{{.State.Pid}}' "${container_of[$1]}"
    else
        ps -o pid= --ppid "$1" | tr -d ' '
    fi
}

# wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds.
wait_for() {
    local limit="$1" what="$2" t0=$SECONDS
    shift 2
    until "$@"; do
        [ $((SECONDS - t0)) -lt "$limit" ] || fail "$what: not within ${limit}s"
        sleep 0.2
    done
}
# exits PID SECONDS: waits for a background job; its status in $status.
exits() {
    local t0=$SECONDS
    while kill -0 "$1" 2>/dev/null; do
        [ $((SECONDS - t0)) -lt "$2" ] || return 1
        sleep 0.2
    done
    status=0
    wait "$1" || status=$?
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ---- 2. baton check in the image
in_image "$work/check.log" -- check "${plugins[@]}"
exits "$last_pid" 120 || fail "baton check in the image did not finish within 120s"
if [ "$status" != 0 ] || [ "$(grep -c ': ok: targets ' "$work/check.log")" != "${#plugins[@]}" ]; then
    cat "$work/check.log" >&2
    fail "baton check in the image: status $status"
fi
pass "baton check in the image ($runner): $(grep -o 'targets [^ ]*' "$work/check.log" | tr '\n' ' ')"

# ---- the API server, the manifests' RBAC, a kubeconfig for baton-a
scripts/kube-testenv.sh start >/dev/null
# shellcheck disable=SC1090
. "$BATON_KUBE_ENV"
[ -n "$KUBE_TEST_KUBECTL" ] || die "no kubectl: deploy/kubernetes/verify.sh cannot apply the Role"
deploy/kubernetes/verify.sh >"$work/verify.log" 2>&1 || { cat "$work/verify.log" >&2; fail "deploy/kubernetes/verify.sh"; }
pass "deploy/kubernetes/verify.sh: the manifests apply ($(sed -n 's/^verify: ok: the Deployment runs one image, \(.*\): scripts.*/image \1/p' "$work/verify.log")); the Role is bound to baton-a in namespace $ns"
token="$(sed -n 's/^ *token: *//p' "$KUBE_TEST_KUBECONFIG_DIR/baton-a.kubeconfig")"
cat >"$work/mnt/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: $KUBE_TEST_SERVER
    certificate-authority-data: $(base64 -w0 "$KUBE_TEST_CA")
users:
- name: baton-a
  user:
    token: $token
contexts:
- name: baton-a@test
  context: { cluster: test, user: baton-a, namespace: $ns }
current-context: baton-a@test
EOF
chmod 644 "$work/mnt/kubeconfig"

holder() {
    curl -sS --max-time 5 --cacert "$KUBE_TEST_CA" -H "Authorization: Bearer $KUBE_TEST_ADMIN_TOKEN" \
        "$KUBE_TEST_SERVER/apis/coordination.k8s.io/v1/namespaces/$ns/leases/$lease" 2>/dev/null |
        grep -o '"holderIdentity": *"[^"]*"' | sed 's/.*"\([^"]*\)"$/\1/'
}
holder_is() { [ "$(holder)" = "$1" ]; }
# role LOG ROLE: the host of LOG has said it is ROLE for the lease.
role() { grep -q "lease status changed lease=$lease role=$2 " "$1"; }
# The term of the host of LOG's last "leading" line.
term_of() { grep "lease status changed lease=$lease role=leading " "$1" | tail -n1 | sed -n 's/.* term=\([0-9]*\).*/\1/p'; }
ticks() { grep -q "tick term=$2 " "$1"; }
readyz() { [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$1/readyz")" = 200 ]; }

# The outside host: the image's configuration, its plugins and cache here.
outside_port="$(free_port)"
mkdir -p "$work/outside-cache"
sed -e "s|\"/opt/baton/plugins/|\"$rootfs/opt/baton/plugins/|" \
    -e "s|^cache-dir = .*|cache-dir = \"$work/outside-cache\"|" \
    -e "s|^admin-address = .*|admin-address = \"127.0.0.1:$outside_port\"|" \
    "$rootfs/etc/baton/baton.toml" >"$work/outside.toml"
start_outside() {
    # POD_NAME: the configuration's lease has route-label = true; no such
    # pod exists here, so labelling it fails (logged) and nothing else.
    NO_COLOR=1 BATON_IDENTITY=outside-o POD_NAME=outside-o "$outside_bin" run --config "$work/outside.toml" \
        --kubeconfig "$work/mnt/kubeconfig" </dev/null >"$work/outside.log" 2>&1 &
    outside_pid=$!
    pids+=("$outside_pid")
}
image_host() { # ID LOG PORT
    in_image "$2" "BATON_IDENTITY=$1" "POD_NAME=$1" NO_COLOR=1 BATON_KUBECONFIG=/etc/baton-test/kubeconfig \
        "BATON_ADMIN_ADDRESS=127.0.0.1:$3" -- run
}

# ---- 3. the image's host leads, the outside host follows
a_port="$(free_port)"
image_host image-a "$work/a.log" "$a_port"
a_pid=$last_pid
wait_for 120 "the image's host image-a leads" holder_is image-a
wait_for 30 "image-a says it leads" role "$work/a.log" leading
t1="$(term_of "$work/a.log")"
wait_for 30 "image-a's plugins tick in term $t1" ticks "$work/a.log" "$t1"
wait_for 30 "image-a's /readyz answers 200" readyz "$a_port"
start_outside
wait_for 60 "the outside host follows" role "$work/outside.log" following
holder_is image-a || fail "the holder changed to $(holder) when the outside host started"
pass "the image's host image-a leads (term $t1, plugins ticking, /readyz 200); the outside host follows"

# ---- 4. SIGTERM to the image's host: the outside host takes over
a_baton="$(baton_pid "$a_pid")"
[ -n "$a_baton" ] || fail "no baton process for image-a"
[ "$(awk '/^Uid:/ { print $2 }' "/proc/$a_baton/status")" = 65532 ] || fail "image-a's baton does not run as uid 65532"
# No HOME of its own: unset, or / (not writable by 65532) where the runtime
# sets it, as podman and the kubelet's runtimes do for a user without a
# passwd entry. No TMPDIR.
a_env="$(tr '\0' '\n' <"/proc/$a_baton/environ")"
grep -q '^TMPDIR=' <<<"$a_env" && fail "image-a's baton has TMPDIR set"
a_home="$(sed -n 's/^HOME=//p' <<<"$a_env")"
[ -z "$a_home" ] || [ "$a_home" = / ] || fail "image-a's baton has HOME=$a_home"
t0=$(date +%s%N)
kill -TERM "$a_baton"
wait_for 30 "the outside host takes over from image-a" holder_is outside-o
took_ms=$((($(date +%s%N) - t0) / 1000000))
exits "$a_pid" 30 || fail "image-a did not exit within 30s of SIGTERM"
[ "$status" = 0 ] || fail "image-a exited with status $status"
grep -q "released the lease" "$work/a.log" || fail "image-a did not say it released the lease"
wait_for 30 "the outside host says it leads" role "$work/outside.log" leading
t2="$(term_of "$work/outside.log")"
[ "$t2" -gt "$t1" ] || fail "the outside host's term $t2 is not above image-a's $t1"
wait_for 30 "the outside host's plugins tick in term $t2" ticks "$work/outside.log" "$t2"
pass "SIGTERM to image-a (uid 65532, HOME ${a_home:-unset}, no TMPDIR): it released the lease and exited 0; the outside host leads term $t2 after ${took_ms} ms"

# ---- 5. a second image host follows, and takes over from the outside host
b_port="$(free_port)"
image_host image-b "$work/b.log" "$b_port"
b_pid=$last_pid
wait_for 60 "image-b follows" role "$work/b.log" following
t0=$(date +%s%N)
kill -TERM "$outside_pid"
wait_for 30 "image-b takes over from the outside host" holder_is image-b
took_ms=$((($(date +%s%N) - t0) / 1000000))
exits "$outside_pid" 30 || fail "the outside host did not exit within 30s of SIGTERM"
[ "$status" = 0 ] || fail "the outside host exited with status $status"
wait_for 30 "image-b says it leads" role "$work/b.log" leading
t3="$(term_of "$work/b.log")"
[ "$t3" -gt "$t2" ] || fail "image-b's term $t3 is not above the outside host's $t2"
wait_for 30 "image-b's plugins tick in term $t3" ticks "$work/b.log" "$t3"
pass "image-b followed, then took over from the outside host (term $t3, after ${took_ms} ms)"

# ---- 6. and stops cleanly
kill -TERM "$(baton_pid "$b_pid")"
exits "$b_pid" 30 || fail "image-b did not exit within 30s of SIGTERM"
[ "$status" = 0 ] || fail "image-b exited with status $status"
pass "image-b exited 0 on SIGTERM"
echo "image-test: $passed passed, 0 failed" >&2
