#!/usr/bin/env bash
# Builds {{name}}.wasm with wit-bindgen's C generator, clang and wasi-libc,
# then adapts the WASI preview-1 module to a component with jco.
# Needs: cargo install wit-bindgen-cli --version 0.61.1 (or set WIT_BINDGEN);
# apt-get install clang-19 lld-19 wasi-libc libclang-rt-19-dev-wasm32 (or set
# CLANG); npm install @bytecodealliance/jco (or set JCO).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p gen
"${WIT_BINDGEN:-wit-bindgen}" c wit --world plugin --out-dir gen
"${CLANG:-clang-19}" --target=wasm32-wasi --sysroot=/usr -mexec-model=reactor -O2 -I gen \
    plugin.c gen/plugin.c gen/plugin_component_type.o -o gen/{{name}}.core.wasm
"${JCO:-jco}" new gen/{{name}}.core.wasm --wasi-reactor -o {{name}}.wasm
echo "built $(pwd)/{{name}}.wasm"
