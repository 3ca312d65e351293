# The end of every template's build.sh (`baton new` appends it).
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
