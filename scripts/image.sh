#!/usr/bin/env bash
# Builds baton's container image (Containerfile) into an OCI image archive:
# the static host, the two Rust example plugins and the Kubernetes
# configuration of deploy/kubernetes/configmap.yaml, FROM scratch.
#
#   scripts/image.sh [ARCHIVE]
#   scripts/image.sh --install-only   # installs what it needs, builds nothing
#
# ARCHIVE defaults to $BATON_CACHE/image/baton-<tag>.oci.tar. The image is
# named baton:<tag> in it (BATON_IMAGE_NAME, BATON_IMAGE_TAG; the tag defaults
# to the workspace's version, Cargo.toml). Prints the archive's path on stdout.
#
# Installs what it needs and caches it: the x86_64-unknown-linux-musl target
# (rustup), and with apt-get (root) musl-tools (musl-gcc, for the C parts of
# ring, zstd and wasmtime), buildah (builds the image from the Containerfile,
# daemonless, in a storage of its own under $BATON_CACHE/image) and skopeo
# (checks the archive). The host is built in release mode for the musl target
# in the shared target directory ($CARGO_TARGET_DIR, scripts/env.sh): the
# first time it compiles wasmtime again for that target, about 20 minutes on
# 2 cores; the guests by scripts/build-guests.sh. The build is reproducible:
# every time stamp is the last commit's time.
#
# Push it with skopeo (or load it with podman / docker load):
#   skopeo copy oci-archive:ARCHIVE docker://registry.example.com/baton:0.1.0
# scripts/image-test.sh proves an archive.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"
cd "$repo"

target=x86_64-unknown-linux-musl
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)"
name="${BATON_IMAGE_NAME:-baton}"
tag="${BATON_IMAGE_TAG:-$version}"
image_dir="$BATON_CACHE/image"
install_only=
if [ "${1:-}" = --install-only ]; then
    install_only=1
    shift
fi
archive="${1:-$image_dir/$name-$tag.oci.tar}"
plugins=(rust_future_ticker rust_pollable_ticker)

log() { echo "image: $*" >&2; }
die() { echo "image: error: $*" >&2; exit 1; }

# ---- install (each step skipped when already done)
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
apt_packages=(musl-tools buildah skopeo)
missing=()
for p in "${apt_packages[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "install ${missing[*]} (apt-get; needs root)"
    log "apt-get install ${missing[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    fi
fi
"$(dirname "$0")/build-tools.sh"
if [ ! -d "$(rustc --print sysroot)/lib/rustlib/$target" ]; then
    rustup target add "$target" >&2
fi

[ -z "$install_only" ] || exit 0

# ---- build
t0=$SECONDS
guests="$(scripts/build-guests.sh)"
log "cargo build --release --target $target -p baton (static; the first time about 20 minutes)"
cargo build --release --target "$target" -p baton >&2
bin="$CARGO_TARGET_DIR/$target/release/baton"
# Static: no program interpreter (a dynamic executable names ld.so).
if readelf -l "$bin" | grep -q 'program interpreter'; then
    die "$bin is not static"
fi
log "built in $((SECONDS - t0))s"

# ---- the build context
ctx="$image_dir/context"
rm -rf "$ctx"
mkdir -p "$ctx/plugins" "$ctx/root/tmp" "$ctx/root/var/cache" "$ctx/cache/baton"
chmod 1777 "$ctx/root/tmp"
chmod 0700 "$ctx/cache/baton"
cp "$bin" "$ctx/baton"
for p in "${plugins[@]}"; do
    wasm="$(grep "/$p.wasm\$" <<<"$guests")" || die "build-guests.sh built no $p.wasm"
    cp "$wasm" "$ctx/plugins/"
done
# The ConfigMap's baton.toml (its block, less the 4 spaces of indentation).
awk '/^  baton\.toml: \|/ { on = 1; next }
     on && /^    / { sub(/^    /, ""); print; next }
     on && /^[[:space:]]*$/ { print ""; next }
     on { exit }' deploy/kubernetes/configmap.yaml >"$ctx/baton.toml"
grep -q '^kind = "kubernetes"' "$ctx/baton.toml" || die "no baton.toml found in deploy/kubernetes/configmap.yaml"
for p in "${plugins[@]}"; do
    grep -q "path = \"/opt/baton/plugins/$p.wasm\"" "$ctx/baton.toml" ||
        die "the configuration in deploy/kubernetes/configmap.yaml does not name /opt/baton/plugins/$p.wasm"
done

# ---- the image, in a storage of buildah's own (not the machine's)
storage="$image_dir/storage"
bah() { buildah --root "$storage/root" --runroot "$storage/run" --storage-driver vfs "$@"; }
epoch="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
ref="localhost/$name:$tag"
log "buildah bud -t $ref (time stamps: $(date -u -d "@$epoch" +%FT%TZ))"
bah bud --quiet --timestamp "$epoch" --build-arg "VERSION=$tag" -f "$repo/Containerfile" -t "$ref" "$ctx" >/dev/null
mkdir -p "$(dirname "$archive")"
rm -f "$archive.tmp"
bah push --quiet --format oci --compression-format gzip "$ref" "oci-archive:$archive.tmp:$name:$tag"
mv "$archive.tmp" "$archive"
# vfs keeps a full copy of every image: drop it, the archive is the product.
bah rmi --force "$ref" >/dev/null 2>&1 || true
rm -rf "$ctx"

# ---- check it, and say what it is
inspect="$(skopeo inspect "oci-archive:$archive:$name:$tag")" || die "skopeo cannot read $archive"
digest="$(sed -n 's/^ *"Digest": "\(.*\)",$/\1/p' <<<"$inspect")"
layers_size="$(tar -tvf "$archive" | awk '$6 ~ /^blobs\// { s += $3 } END { print s }')"
log "$archive: $name:$tag, manifest $digest, $(du -k "$archive" | cut -f1) KiB on disk ($layers_size bytes of blobs, compressed); binary $(du -k "$bin" | cut -f1) KiB"
echo "$archive"
