#!/usr/bin/env bash
# Proves the manifests in this folder against a real API server, the one
# `scripts/kube-testenv.sh start` runs (scripts/test.sh does both):
#
#   1. the API server accepts every manifest (kubectl apply --dry-run=server,
#      both through kustomization.yaml and file by file);
#   2. the Role grants exactly what baton's lease store uses: the
#      ServiceAccount, and the test user baton-a bound to the same Role by an
#      extra RoleBinding made here (not shipped), may get, list, watch, create,
#      update and delete Leases in the namespace, and may not patch them,
#      read Secrets, or touch Leases in another namespace; may get, list,
#      create and update ConfigMaps (term floors, buckets) but not watch,
#      patch or delete them; may get, list and patch Pods (the route
#      label) but not create, update, delete or watch them; user nobody may
#      do nothing with Leases;
#   3. baton-a really creates, updates and deletes a Lease; and, running a
#      real `baton` host (built here with `cargo build -p baton --features test-hooks` unless
#      BATON_BIN names one) with the kv-counter guest
#      (scripts/build-guests.sh), a plugin's write to its key-value bucket
#      lands (a ConfigMap labelled baton.dev/role=bucket), and `baton kv
#      list`, `get` and `put` work, all as baton-a;
#   4. the admin port agrees everywhere: the ConfigMap's admin-address, the
#      container port, the prometheus.io/port annotation, and the liveness
#      (/healthz) and readiness (/readyz) probes on it; the preStop hook's
#      `baton drain --timeout T` leaves room for SIGTERM's hand-over:
#      T + grace + renew-deadline < terminationGracePeriodSeconds.
#   4c. the route label: as baton-a, a pod is labelled and unlabelled by
#      merge patches (the requests baton makes), found by the label
#      selector; the Service of service-leader.yaml selects the key of the
#      ConfigMap's lease with route-label = true (baton.dev/lead-<lease>);
#      the Deployment sets POD_NAME and POD_NAMESPACE from the downward API,
#      and POD_IP (the advertised address) from status.podIP.
#   4d. the image-pull Secret of registry-secret.yaml (a Docker config.json)
#      is mounted by the Deployment where the ConfigMap's commented
#      [registry] auth-file points (docs/registries.md).
#   5. the image is the one scripts/image.sh builds: <registry>/baton:<the
#      workspace's version>, the only image of the Deployment.
#
# Usage: deploy/kubernetes/verify.sh [ENV_FILE]
#   ENV_FILE: the file `kube-testenv.sh start` wrote (default: $BATON_KUBE_ENV,
#   else the KUBE_TEST_* variables already set, else
#   $BATON_CACHE/kube/run/env.sh).
# Leaves the namespace, the ServiceAccount, the Role and both RoleBindings in
# place (the test server is thrown away by `kube-testenv.sh stop`).
# Exits 0 if everything holds (or kubectl is missing: then it says so and
# checks nothing), 1 with a message naming each failed check otherwise.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
. "$repo/scripts/env.sh"

env_file="${1:-${BATON_KUBE_ENV:-}}"
if [ -z "$env_file" ] && [ -z "${KUBE_TEST_SERVER:-}" ]; then
    env_file="$BATON_CACHE/kube/run/env.sh"
fi
if [ -n "$env_file" ]; then
    [ -f "$env_file" ] || { echo "verify: error: no env file $env_file (run scripts/kube-testenv.sh start)" >&2; exit 1; }
    # shellcheck disable=SC1090
    . "$env_file"
fi
for v in KUBE_TEST_SERVER KUBE_TEST_KUBECONFIG KUBE_TEST_KUBECONFIG_DIR; do
    [ -n "${!v:-}" ] || { echo "verify: error: $v is not set (run scripts/kube-testenv.sh start)" >&2; exit 1; }
done
if [ -z "${KUBE_TEST_KUBECTL:-}" ] || [ ! -x "$KUBE_TEST_KUBECTL" ]; then
    echo "verify: SKIPPED: no kubectl (KUBE_TEST_KUBECTL is empty): the manifests in $here were not checked" >&2
    exit 0
fi

# The namespace the manifests name (the placeholder `baton`).
ns="$(awk '$1 == "namespace:" { print $2; exit }' "$here/role.yaml")"
manifests=(serviceaccount.yaml role.yaml rolebinding.yaml configmap.yaml registry-secret.yaml deployment.yaml service-leader.yaml)

failures=()
fail() { failures+=("$*"); echo "verify: FAIL: $*" >&2; }
ok() { echo "verify: ok: $*" >&2; }
as_admin() { "$KUBE_TEST_KUBECTL" --kubeconfig "$KUBE_TEST_KUBECONFIG" --request-timeout=30s "$@"; }
as_user() { local u="$1"; shift; "$KUBE_TEST_KUBECTL" --kubeconfig "$KUBE_TEST_KUBECONFIG_DIR/$u.kubeconfig" --request-timeout=30s "$@"; }
die() { echo "verify: error: $*" >&2; exit 1; }

echo "verify: checking $here against $KUBE_TEST_SERVER, namespace $ns" >&2

# ---- 1. the API server accepts the manifests
as_admin get namespace "$ns" >/dev/null 2>&1 || as_admin create namespace "$ns" >&2 ||
    die "cannot create namespace $ns"

# Every manifest in the folder is listed in kustomization.yaml, and only those.
listed="$(awk '/^resources:/ { on = 1; next } on && $1 == "-" { print $2 } on && !/^ / && !/^-/ { on = 0 }' \
    "$here/kustomization.yaml" | sort | tr '\n' ' ')"
present="$(cd "$here" && ls -- *.yaml | grep -vx kustomization.yaml | sort | tr '\n' ' ')"
expected="$(printf '%s\n' "${manifests[@]}" | sort | tr '\n' ' ')"
if [ "$listed" = "$present" ] && [ "$present" = "$expected" ]; then
    ok "kustomization.yaml lists every manifest: $listed"
else
    fail "kustomization.yaml lists [$listed], the folder holds [$present], expected [$expected]"
fi

# `kubectl apply -f deploy/kubernetes/` would also send kustomization.yaml,
# which is not a cluster object: apply through it (-k), and file by file.
if out="$(as_admin apply --dry-run=server -k "$here" 2>&1)"; then
    ok "kubectl apply --dry-run=server -k $here: $(echo "$out" | wc -l) objects accepted"
else
    fail "kubectl apply --dry-run=server -k $here: $out"
fi
files=()
for m in "${manifests[@]}"; do files+=(-f "$here/$m"); done
if out="$(as_admin apply --dry-run=server "${files[@]}" 2>&1)"; then
    ok "kubectl apply --dry-run=server -f ${manifests[*]}: accepted"
else
    fail "kubectl apply --dry-run=server -f ${manifests[*]}: $out"
fi

# ---- 2. RBAC
as_admin apply -f "$here/serviceaccount.yaml" -f "$here/role.yaml" -f "$here/rolebinding.yaml" >&2 ||
    die "cannot apply the ServiceAccount, Role and RoleBinding"
# Test only: the shipped Role, bound also to the token user baton-a.
as_admin apply -f - >&2 <<EOF || die "cannot bind the Role to user baton-a"
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: baton-verify-user-baton-a
  namespace: $ns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: baton
subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: baton-a
EOF

# expect WHO yes|no VERB RESOURCE NAMESPACE
# WHO: a user with a kubeconfig in KUBE_TEST_KUBECONFIG_DIR, or sa (the
# ServiceAccount, by impersonation as admin).
expect() {
    local who="$1" want="$2" verb="$3" res="$4" where="$5" got
    if [ "$who" = sa ]; then
        got="$(as_admin auth can-i "$verb" "$res" -n "$where" --as="system:serviceaccount:$ns:baton" 2>/dev/null || true)"
        who="serviceaccount $ns/baton"
    else
        got="$(as_user "$who" auth can-i "$verb" "$res" -n "$where" 2>/dev/null || true)"
        who="user $who"
    fi
    if [ "$got" = "$want" ]; then
        ok "$who can-i $verb $res -n $where: $got"
    else
        fail "$who can-i $verb $res -n $where: expected $want, got '${got:-an error}'"
    fi
}
leases=leases.coordination.k8s.io
for who in sa baton-a; do
    for verb in get list watch create update delete; do expect "$who" yes "$verb" "$leases" "$ns"; done
    for verb in patch deletecollection; do expect "$who" no "$verb" "$leases" "$ns"; done
    for verb in get list watch create update; do expect "$who" yes "$verb" configmaps "$ns"; done
    for verb in delete patch; do expect "$who" no "$verb" configmaps "$ns"; done
    for verb in get list patch; do expect "$who" yes "$verb" pods "$ns"; done
    for verb in create update delete watch; do expect "$who" no "$verb" pods "$ns"; done
    expect "$who" no get secrets "$ns"
    expect "$who" no create "$leases" default
done
for verb in get create update; do expect nobody no "$verb" "$leases" "$ns"; done

# ---- 3. real requests as baton-a
lease=baton-verify
as_admin delete "$leases" "$lease" -n "$ns" --ignore-not-found >/dev/null 2>&1 || true
lease_yaml() { # holder transitions [resourceVersion]
    local rv_line=
    [ -z "${3:-}" ] || rv_line="  resourceVersion: \"$3\""
    cat <<EOF
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: $lease
  namespace: $ns
  labels: { app.kubernetes.io/name: baton }
$rv_line
spec:
  holderIdentity: $1
  leaseDurationSeconds: 15
  leaseTransitions: $2
EOF
}
if out="$(lease_yaml baton-a 1 | as_user baton-a create -f - 2>&1)"; then
    ok "baton-a created Lease $ns/$lease"
    rv="$(as_user baton-a get "$leases" "$lease" -n "$ns" -o 'jsonpath={.metadata.resourceVersion}' 2>&1)" ||
        fail "baton-a cannot get Lease $ns/$lease: $rv"
    if out="$(lease_yaml baton-a 2 "$rv" | as_user baton-a replace -f - 2>&1)"; then
        ok "baton-a updated Lease $ns/$lease at resourceVersion $rv"
    else
        fail "baton-a cannot update Lease $ns/$lease: $out"
    fi
    if out="$(lease_yaml baton-a 3 "$rv" | as_user baton-a replace -f - 2>&1)"; then
        fail "baton-a updated Lease $ns/$lease at the stale resourceVersion $rv"
    elif echo "$out" | grep -qi conflict; then
        ok "baton-a's update at the stale resourceVersion $rv conflicts"
    else
        fail "baton-a's update at a stale resourceVersion failed, but not with a conflict: $out"
    fi
    if out="$(as_user baton-a delete "$leases" "$lease" -n "$ns" 2>&1)"; then
        ok "baton-a deleted Lease $ns/$lease"
    else
        fail "baton-a cannot delete Lease $ns/$lease: $out"
    fi
else
    fail "baton-a cannot create Lease $ns/$lease: $out"
fi
if out="$(lease_yaml nobody 1 | as_user nobody create -f - 2>&1)"; then
    fail "nobody created a Lease in $ns"
elif echo "$out" | grep -qi forbidden; then
    ok "nobody may not create a Lease in $ns (forbidden)"
else
    fail "nobody's create failed, but not as forbidden: $out"
fi
as_admin delete "$leases" "$lease" -n "$ns" --ignore-not-found >/dev/null 2>&1 || true

# ---- 3b. a plugin's bucket and `baton kv`, as baton-a under the Role
kv_lease=baton-verify-kv
bucket_cm="baton-bucket.$kv_lease.counter"
guests="${BATON_GUESTS_DIR:-$CARGO_TARGET_DIR/wasm32-wasip2/release}"
if [ ! -f "$guests/kv_counter.wasm" ]; then
    "$repo/scripts/build-guests.sh" >/dev/null || die "cannot build the guests (scripts/build-guests.sh)"
fi
if [ -n "${BATON_BIN:-}" ]; then
    baton="$BATON_BIN"
else
    # The features of scripts/test.sh, which runs this first: one build of
    # the host (and of tokio and what uses it) for the whole suite.
    (cd "$repo" && cargo build -p baton --features test-hooks --quiet) ||
        die "cannot build baton (cargo build -p baton --features test-hooks)"
    baton="$CARGO_TARGET_DIR/debug/baton"
fi
kv_dir="$(mktemp -d)"
host_pid=
cleanup_kv() {
    [ -z "$host_pid" ] || kill "$host_pid" 2>/dev/null || true
    rm -rf "$kv_dir"
}
trap cleanup_kv EXIT
# A fresh start: the bucket, the lease and its term floor of an earlier run.
kv_clean() {
    as_admin delete configmap "$bucket_cm" "baton-terms.$kv_lease" -n "$ns" --ignore-not-found >/dev/null 2>&1 || true
    as_admin delete "$leases" "$kv_lease" -n "$ns" --ignore-not-found >/dev/null 2>&1 || true
}
kv_clean
cat >"$kv_dir/baton.toml" <<EOF
[store]
kind = "kubernetes"
namespace = "$ns"
kubeconfig = "$KUBE_TEST_KUBECONFIG_DIR/baton-a.kubeconfig"
[defaults]
lease-duration = "4s"
renew-deadline = "2s"
retry-period = "500ms"
grace = "1s"
[[lease]]
name = "$kv_lease"
[[plugin]]
name = "counter"
path = "$guests/kv_counter.wasm"
lease = "$kv_lease"
env = { KV_MODE = "once" }
EOF
kv() { "$baton" kv "$@" --config "$kv_dir/baton.toml"; }
"$baton" --log-format json run --config "$kv_dir/baton.toml" --identity verify-kv \
    2>"$kv_dir/host.log" >/dev/null &
host_pid=$!
for _ in $(seq 600); do
    grep -q -e '"message":"kv ok n=1 ' -e '"message":"kv error' "$kv_dir/host.log" 2>/dev/null && break
    kill -0 "$host_pid" 2>/dev/null || break
    sleep 0.1
done
if grep -q '"message":"kv ok n=1 ' "$kv_dir/host.log"; then
    ok "a plugin's write to its bucket as baton-a: $(grep -o '"message":"kv ok[^"]*"' "$kv_dir/host.log" | head -1)"
else
    fail "the kv-counter guest's write as baton-a did not land in 60 s; the host's log: $(tail -c 2000 "$kv_dir/host.log")"
fi
kill -TERM "$host_pid" 2>/dev/null || true
wait "$host_pid" 2>/dev/null || true
host_pid=
if out="$(as_user baton-a get configmaps -n "$ns" -l baton.dev/role=bucket -o name 2>&1)" &&
    grep -qx "configmap/$bucket_cm" <<<"$out"; then
    ok "the bucket is ConfigMap $bucket_cm, labelled baton.dev/role=bucket"
else
    fail "no ConfigMap $bucket_cm labelled baton.dev/role=bucket: $out"
fi
if out="$(kv list -o json 2>&1)" && grep -q '"bucket": "counter"' <<<"$out" && grep -q '"entries": 1' <<<"$out"; then
    ok "baton kv list as baton-a: bucket counter, 1 entry"
else
    fail "baton kv list as baton-a: $out"
fi
if out="$(kv get count 2>&1)" && [[ "$out" == "1 "* ]]; then
    ok "baton kv get count as baton-a: $out"
else
    fail "baton kv get count as baton-a: $out"
fi
if out="$(kv put note verified 2>&1)" && [ "$(kv get note 2>&1)" = verified ]; then
    ok "baton kv put as baton-a (an operator's term of its own): $out"
else
    fail "baton kv put as baton-a: $out"
fi
kv_clean

# ---- 4. the admin port
admin_port="$(sed -n 's/^ *admin-address *= *"[^"]*:\([0-9][0-9]*\)".*/\1/p' "$here/configmap.yaml")"
container_port="$(awk '$1 == "-" && $2 == "name:" && $3 == "admin" { on = 1; next } on && $1 == "containerPort:" { print $2; exit }' "$here/deployment.yaml")"
annotated_port="$(sed -n 's/^ *prometheus.io\/port: *"\([0-9]*\)".*/\1/p' "$here/deployment.yaml")"
if [ -n "$admin_port" ] && [ "$admin_port" = "$container_port" ] && [ "$admin_port" = "$annotated_port" ]; then
    ok "admin port $admin_port: the ConfigMap's admin-address, the container port and the prometheus.io/port annotation agree"
else
    fail "admin port: ConfigMap admin-address '${admin_port:-none}', container port 'admin' '${container_port:-none}', prometheus.io/port '${annotated_port:-none}'"
fi
for probe in "livenessProbe /healthz" "readinessProbe /readyz"; do
    set -- $probe
    if awk -v p="$1:" -v path="$2" '$1 == p { on = 1; next } on && $1 == "path:" { found = ($2 == path); exit } END { exit !found }' "$here/deployment.yaml" &&
        awk -v p="$1:" '$1 == p { on = 1; next } on && $1 == "port:" { found = ($2 == "admin"); exit } END { exit !found }' "$here/deployment.yaml"; then
        ok "$1: GET $2 on port admin"
    else
        fail "$1: expected an httpGet of $2 on port admin in deployment.yaml"
    fi
done

# ---- 4b. the preStop drain fits in the termination grace period: the
# drain's --timeout, then what SIGTERM may still take (grace + renew
# deadline of the ConfigMap's [defaults]), below terminationGracePeriodSeconds.
secs() { sed -n 's/^ *'"$1"' *= *"\([0-9][0-9]*\)s".*/\1/p' "$here/configmap.yaml" | head -1; }
period="$(awk '$1 == "terminationGracePeriodSeconds:" { print $2; exit }' "$here/deployment.yaml")"
drain_timeout="$(grep -o '"drain", "--timeout", "[0-9]*s"' "$here/deployment.yaml" | sed 's/.*"\([0-9]*\)s"$/\1/')"
grace="$(secs grace)"; renew="$(secs renew-deadline)"
if [ -n "$period" ] && [ -n "$drain_timeout" ] && [ -n "$grace" ] && [ -n "$renew" ] &&
    [ $((drain_timeout + grace + renew)) -lt "$period" ]; then
    ok "preStop: baton drain --timeout ${drain_timeout}s + grace ${grace}s + renew-deadline ${renew}s < terminationGracePeriodSeconds ${period}"
else
    fail "preStop: expected baton drain --timeout T with T + grace + renew-deadline < terminationGracePeriodSeconds (got T '${drain_timeout:-none}', grace '${grace:-none}', renew-deadline '${renew:-none}', period '${period:-none}')"
fi

# ---- 4c. the route label, as baton-a under the Role
route_lease="$(awk '/^ *\[\[lease\]\]/ { name = "" } /^ *name *= *"/ { gsub(/.*= *"|".*/, ""); name = $0 }
    /^ *route-label *= *true/ && name != "" { print name; exit }' "$here/configmap.yaml")"
key="baton.dev/lead-$route_lease"
# 4d. plugins from a registry: the Deployment mounts the image-pull Secret
# of registry-secret.yaml where the ConfigMap's [registry] auth-file points,
# and the Secret is a Docker config.json.
secret="$(awk '$1 == "name:" { print $2; exit }' "$here/registry-secret.yaml")"
auth_file="$(sed -n 's|^ *# *auth-file = "\(.*\)"$|\1|p' "$here/configmap.yaml" | head -n1)"
mount="$(awk -v s="$secret" '
    $1 == "-" && $2 == "name:" { name = $3 }
    $1 == "mountPath:" { path[name] = $2 }
    $1 == "secretName:" && $2 == s { vol = name }
    END { print path[vol] }' "$here/deployment.yaml")"
if [ -n "$mount" ] && [ "${auth_file%/*}" = "$mount" ]; then
    ok "the Deployment mounts Secret $secret at $mount, where the ConfigMap's auth-file $auth_file is"
else
    fail "registry credentials: Secret ${secret:-?} mounted at '${mount:-nowhere}', the ConfigMap's auth-file is '${auth_file:-unset}'"
fi
json="$(awk '$1 == ".dockerconfigjson:" { print $2 }' "$here/registry-secret.yaml" | base64 -d 2>/dev/null || true)"
if python3 -c 'import json,sys; d = json.loads(sys.argv[1]); assert isinstance(d["auths"], dict)' "$json" 2>/dev/null; then
    ok "registry-secret.yaml holds a Docker config.json (.dockerconfigjson with auths)"
else
    fail "registry-secret.yaml: .dockerconfigjson is not base64 of a Docker config.json with auths"
fi

if [ -n "$route_lease" ] && grep -q "^    $key: \"true\"\$" "$here/service-leader.yaml"; then
    ok "service-leader.yaml selects $key: \"true\", the route label of lease $route_lease (route-label = true)"
else
    fail "service-leader.yaml should select baton.dev/lead-<lease>: \"true\" of the ConfigMap's lease with route-label = true (found lease '${route_lease:-none}')"
fi
for v in "POD_NAME metadata.name" "POD_NAMESPACE metadata.namespace" "POD_IP status.podIP"; do
    set -- $v
    if awk -v n="$1" -v f="$2" '$1 == "-" && $2 == "name:" { on = ($3 == n); next } on && $1 == "fieldPath:" { found = ($2 == f); exit } END { exit !found }' "$here/deployment.yaml"; then
        ok "the Deployment sets $1 from the downward API ($2)"
    else
        fail "the Deployment should set $1 from the downward API (fieldRef $2)"
    fi
done
as_admin get serviceaccount default -n "$ns" >/dev/null 2>&1 || as_admin create serviceaccount default -n "$ns" >&2 ||
    die "cannot create the default ServiceAccount in $ns (pods need it)"
pod=baton-verify-pod
as_admin delete pod "$pod" -n "$ns" --ignore-not-found --wait=false >/dev/null 2>&1 || true
as_admin apply -f - >&2 <<EOF || die "cannot create pod $ns/$pod"
apiVersion: v1
kind: Pod
metadata:
  name: $pod
  namespace: $ns
spec:
  automountServiceAccountToken: false
  containers: [{ name: baton, image: registry.invalid/baton:none }]
EOF
if out="$(as_user baton-a patch pod "$pod" -n "$ns" --type merge -p "{\"metadata\":{\"labels\":{\"$key\":\"true\"}}}" 2>&1)" &&
    [ "$(as_user baton-a get pods -n "$ns" -l "$key" -o name 2>&1)" = "pod/$pod" ]; then
    ok "baton-a labelled pod $ns/$pod $key=true (merge patch) and lists it by the label"
else
    fail "baton-a cannot label pod $ns/$pod with $key: $out"
fi
if out="$(as_user baton-a patch pod "$pod" -n "$ns" --type merge -p "{\"metadata\":{\"labels\":{\"$key\":null}}}" 2>&1)" &&
    [ -z "$(as_user baton-a get pods -n "$ns" -l "$key" -o name 2>&1)" ]; then
    ok "baton-a removed $key from pod $ns/$pod (merge patch, null)"
else
    fail "baton-a cannot remove $key from pod $ns/$pod: $out"
fi
as_admin delete pod "$pod" -n "$ns" --ignore-not-found --wait=false >/dev/null 2>&1 || true

# ---- 5. the image
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml")"
images="$(awk '$1 == "image:" || ($1 == "-" && $2 == "image:") { print $NF }' "$here/deployment.yaml" | sort -u | tr '\n' ' ')"
n_images="$(wc -w <<<"$images")"
if [ "$n_images" -eq 1 ] && [[ "${images% }" == */baton:"$version" ]]; then
    ok "the Deployment runs one image, ${images% }: scripts/image.sh's baton:$version"
else
    fail "the Deployment's images are [${images% }], expected one, <registry>/baton:$version (scripts/image.sh)"
fi

if [ ${#failures[@]} -gt 0 ]; then
    echo "verify: ${#failures[@]} check(s) failed for $here:" >&2
    printf '  - %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "verify: all checks passed for $here" >&2
