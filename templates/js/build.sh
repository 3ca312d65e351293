#!/usr/bin/env bash
# Builds {{name}}.wasm with componentize-js
# (npm install @bytecodealliance/componentize-js@0.23.0; or set COMPONENTIZE_JS
# to its path). `-d http fetch-event` keeps wasi:http out: baton does not
# provide it.
set -euo pipefail
cd "$(dirname "$0")"
"${COMPONENTIZE_JS:-componentize-js}" --wit wit --world-name baton:leader/pollable-plugin@0.1.0 \
    -d http fetch-event -o {{name}}.wasm plugin.js
echo "built $(pwd)/{{name}}.wasm"
