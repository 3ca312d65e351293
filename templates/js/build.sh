#!/usr/bin/env bash
# Builds {{name}}.wasm with componentize-js
# (npm install @bytecodealliance/componentize-js@0.23.0; or set COMPONENTIZE_JS
# to its path), for the world in wit/world.wit. `-d fetch-event` leaves out
# the incoming-handler export (a plugin serves no requests); `fetch` stays.
set -euo pipefail
cd "$(dirname "$0")"
"${COMPONENTIZE_JS:-componentize-js}" --wit wit --world-name plugin \
    -d fetch-event -o {{name}}.wasm plugin.js
echo "built $(pwd)/{{name}}.wasm"
