#!/usr/bin/env bash
# Builds {{name}}.wasm with componentize-py (pip install componentize-py==0.25.1;
# or set COMPONENTIZE_PY to its path).
set -euo pipefail
cd "$(dirname "$0")"
"${COMPONENTIZE_PY:-componentize-py}" -d wit -w plugin \
    componentize app -o {{name}}.wasm
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
