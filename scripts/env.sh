# Sourced by the scripts: one place for the caches that live outside the
# clone, so a second run (or CI on the same machine) reuses them.
#   BATON_CACHE       everything below (default ~/.cache/baton)
#   CARGO_TARGET_DIR  shared by the host, the tests and every guest
export BATON_CACHE="${BATON_CACHE:-$HOME/.cache/baton}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$BATON_CACHE/target}"
export BATON_CACHE_DIR="${BATON_CACHE_DIR:-$BATON_CACHE/compiled}"
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    . "$HOME/.cargo/env"
fi
