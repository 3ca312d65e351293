#!/usr/bin/env bash
# What building the host needs beside cargo: protoc, with the well-known
# protobuf types, for the etcd client's generated gRPC code (Debian's
# protobuf-compiler and libprotobuf-dev). Installed with apt-get (root)
# when missing; nothing to do when present. scripts/demo.sh, test.sh and
# image.sh run it before building.
set -euo pipefail
log() { echo "build-tools: $*" >&2; }
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
if command -v protoc >/dev/null && [ -f /usr/include/google/protobuf/descriptor.proto ]; then
    exit 0
fi
packages=(protobuf-compiler libprotobuf-dev)
missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
[ ${#missing[@]} -gt 0 ] || exit 0
if [ "$(id -u)" != 0 ]; then
    log "error: building baton needs protoc: install ${missing[*]} (apt-get, as root), or set PROTOC"
    exit 1
fi
log "apt-get install ${missing[*]}"
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi
