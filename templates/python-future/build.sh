#!/usr/bin/env bash
# Builds {{name}}.wasm with componentize-py (pip install componentize-py==0.25.1;
# or set COMPONENTIZE_PY to its path).
set -euo pipefail
cd "$(dirname "$0")"
"${COMPONENTIZE_PY:-componentize-py}" -d wit -w plugin \
    componentize app -o {{name}}.wasm
echo "built $(pwd)/{{name}}.wasm"
