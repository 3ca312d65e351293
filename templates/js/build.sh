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

# Tests it, if baton is at hand (BATON names it; BATON_TEST=0 skips this):
# the contract's scenario (lead, lose, pause past the lease, ...), then
# scenario.toml. See docs/testing-plugins.md in the baton repository.
baton=${BATON:-baton}
if [ "${BATON_TEST:-1}" = 0 ]; then
    exit 0
elif command -v "$baton" >/dev/null; then
    "$baton" test {{name}}.wasm --config baton.toml
    "$baton" test {{name}}.wasm --config baton.toml scenario.toml
else
    echo "to test it: baton test {{name}}.wasm --config baton.toml scenario.toml"
fi
