#!/usr/bin/env bash
# Builds the example guests written in Python, JavaScript and C from source,
# installing each toolchain first when it is missing, and prints the paths of
# the .wasm files, one a line, on stdout (progress goes to stderr).
#
#   scripts/build-polyglot-guests.sh
#
# Toolchains, pinned, installed under $BATON_CACHE/tools (outside the clone):
#   Python      componentize-py 0.25.1 (PyPI, in a venv; needs python3 >= 3.10)
#   JavaScript  @bytecodealliance/componentize-js 0.23.0 (StarlingMonkey),
#               componentize-qjs 0.4.5 (QuickJS), @bytecodealliance/jco 1.35.0
#               (npm; needs node and npm)
#   C           wit-bindgen-cli 0.61.1 (cargo install, its C generator alone), and
#               Debian's clang-19, lld-19, wasi-libc, libclang-rt-19-dev-wasm32
#               (apt-get, when missing; needs root)
# Guests go to $BATON_POLYGLOT_DIR (default $BATON_CACHE/polyglot). A guest is
# rebuilt only when its inputs (its sources, the WIT, the tool versions, this
# script) changed, so a second run is quick.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$repo/scripts/env.sh"
tools="$BATON_CACHE/tools"
out="${BATON_POLYGLOT_DIR:-$BATON_CACHE/polyglot}"
mkdir -p "$tools" "$out"

COMPONENTIZE_PY_VERSION=0.25.1
COMPONENTIZE_JS_VERSION=0.23.0
COMPONENTIZE_QJS_VERSION=0.4.5
JCO_VERSION=1.35.0
WIT_BINDGEN_VERSION=0.61.1
CLANG=clang-19
APT_PACKAGES=(clang-19 lld-19 wasi-libc libclang-rt-19-dev-wasm32)

log() { echo "build-polyglot: $*" >&2; }
die() { log "$*"; exit 1; }
timed() { # timed LABEL CMD...: runs CMD, logs how long it took
    local label=$1 start=$SECONDS
    shift
    "$@"
    log "$label took $((SECONDS - start)) s"
}

# --- toolchains -------------------------------------------------------------

py_venv="$tools/componentize-py-$COMPONENTIZE_PY_VERSION"
componentize_py="$py_venv/bin/componentize-py"
install_python() {
    [ -x "$componentize_py" ] && return
    command -v python3 >/dev/null || die "python3 is needed for componentize-py"
    rm -rf "$py_venv"
    python3 -m venv "$py_venv"
    "$py_venv/bin/pip" install --quiet --disable-pip-version-check \
        "componentize-py==$COMPONENTIZE_PY_VERSION" >&2
}

node_dir="$tools/node-cjs$COMPONENTIZE_JS_VERSION-qjs$COMPONENTIZE_QJS_VERSION-jco$JCO_VERSION"
componentize_js="$node_dir/node_modules/.bin/componentize-js"
componentize_qjs="$node_dir/node_modules/.bin/componentize-qjs"
jco="$node_dir/node_modules/.bin/jco"
install_node() {
    [ -x "$componentize_js" ] && [ -x "$componentize_qjs" ] && [ -x "$jco" ] && return
    command -v npm >/dev/null || die "node and npm are needed for componentize-js"
    rm -rf "$node_dir.tmp"
    mkdir -p "$node_dir.tmp"
    (cd "$node_dir.tmp" && echo '{"private": true}' > package.json \
        && npm install --no-audit --no-fund --save-exact \
            "@bytecodealliance/componentize-js@$COMPONENTIZE_JS_VERSION" \
            "componentize-qjs@$COMPONENTIZE_QJS_VERSION" \
            "@bytecodealliance/jco@$JCO_VERSION" >&2)
    rm -rf "$node_dir"
    mv "$node_dir.tmp" "$node_dir"
}

wit_bindgen="$tools/wit-bindgen-$WIT_BINDGEN_VERSION-c/bin/wit-bindgen"
install_c() {
    if ! command -v "$CLANG" >/dev/null || [ ! -f /usr/lib/wasm32-wasi/libc.a ] \
        || ! ls /usr/lib/llvm-19/lib/clang/19/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1 \
        || ! command -v wasm-ld-19 >/dev/null; then
        [ "$(id -u)" = 0 ] || die "install ${APT_PACKAGES[*]} (apt-get; needs root)"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${APT_PACKAGES[@]}" >&2
    fi
    if [ ! -x "$wit_bindgen" ]; then
        # Only the C generator, unoptimised: it writes bindings for one small
        # WIT package, and the default (every language, opt-level 3) took
        # most of the toolchains' time on a cold machine.
        CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_DEBUG=false \
            cargo install wit-bindgen-cli --version "$WIT_BINDGEN_VERSION" --locked \
            --no-default-features --features c,async \
            --root "$tools/wit-bindgen-$WIT_BINDGEN_VERSION-c" >&2
    fi
}

# --- helpers ----------------------------------------------------------------

# The fingerprint of a guest's inputs (paths in the repository): the files
# given, the WIT, this script. By content and relative path, so that a
# fresh clone elsewhere finds the guests its sources built.
fingerprint() {
    local inputs=("${@#"$repo"/}")
    {
        (cd "$repo" && find "${inputs[@]}" wit -type f -print0 | sort -z | xargs -0 sha256sum)
        sha256sum <"${BASH_SOURCE[0]}"
    } | sha256sum | cut -d' ' -f1
}

# fresh OUT INPUTS...: whether OUT is up to date with INPUTS.
fresh() {
    local wasm=$1
    shift
    [ -f "$wasm" ] && [ "$(cat "$wasm.inputs" 2>/dev/null)" = "$(fingerprint "$@")" ]
}

done_with() { # done_with OUT INPUTS...: records OUT's inputs and prints OUT
    local wasm=$1
    shift
    # A component, not a core module: the layer field (bytes 6..8) is 1.
    [ "$(od -An -tx1 -j4 -N4 "$wasm" | tr -d ' \n')" = "0d000100" ] \
        || die "$wasm is not a WebAssembly component"
    fingerprint "$@" > "$wasm.inputs"
    echo "$wasm"
}

# The examples are built against baton:leader@0.1.0 (wit/v0.1.0), which
# hosts keep serving: they prove that plugins built before 0.2.0 run
# unchanged. (The templates of `baton new`, built by the tests, target
# 0.3.0, in wit/v0.3.0; the newest, 0.4.0, is in wit/.)
contract="$repo/wit/v0.1.0"

# The key-value examples (examples/*-kv-counter) import wasi:keyvalue, new
# with baton:leader@0.2.0, and are kept on that contract (wit/v0.2.0), which
# hosts keep serving too.
contract_now="$repo/wit/v0.2.0"

# A WIT folder for a guest with its own world (wit/world.wit that includes a
# baton world): the guest's wit/ plus baton's contract (CONTRACT, default
# 0.1.0) and its WASI deps.
stage_wit() { # stage_wit GUEST [CONTRACT]
    local guest=$1 leader=${2:-$contract} stage
    stage="$(mktemp -d)"
    cp -r "$guest/wit/." "$stage/"
    mkdir -p "$stage/deps/baton-leader"
    cp "$leader/leader.wit" "$stage/deps/baton-leader/"
    cp -r "$repo/wit/deps/." "$stage/deps/"
    echo "$stage"
}

# --- guests -----------------------------------------------------------------

ex="$repo/examples"

python_guest() { # python_guest NAME WORLD
    local name=$1 world=$2 wasm="$out/${1//-/_}.wasm" src
    if ! fresh "$wasm" "$ex/$name"; then
        install_python
        # From a copy: componentize-py writes __pycache__ next to the sources.
        src="$(mktemp -d)"
        cp "$ex/$name"/*.py "$src/"
        timed "$name" "$componentize_py" -d "$contract" -w "baton:leader/$world@0.1.0" \
            componentize -p "$src" app -o "$wasm.tmp" >&2
        rm -rf "$src"
        mv "$wasm.tmp" "$wasm"
    fi
    done_with "$wasm" "$ex/$name"
}

# python_world_guest NAME PKG/WORLD: a guest with its own wit/world.wit on
# the 0.2.0 contract.
python_world_guest() {
    local name=$1 world=$2 wasm="$out/${1//-/_}.wasm" src stage
    if ! fresh "$wasm" "$ex/$name"; then
        install_python
        src="$(mktemp -d)"
        cp "$ex/$name"/*.py "$src/"
        stage="$(stage_wit "$ex/$name" "$contract_now")"
        timed "$name" "$componentize_py" -d "$stage" -w "$world" \
            componentize -p "$src" app -o "$wasm.tmp" >&2
        rm -rf "$src" "$stage"
        mv "$wasm.tmp" "$wasm"
    fi
    done_with "$wasm" "$ex/$name"
}

# js_guest NAME FILE [FLAGS...]: componentize-js (StarlingMonkey), pollable world.
js_guest() {
    local name=$1 file=$2 wasm stage src="$ex/js-pollable-ticker"
    shift 2
    wasm="$out/$file"
    if ! fresh "$wasm" "$src"; then
        install_node
        stage="$(stage_wit "$src")"
        timed "$name" "$componentize_js" --wit "$stage" --world-name example:js-pollable-ticker/ticker \
            "$@" -o "$wasm.tmp" "$src/ticker.js" >&2
        rm -rf "$stage"
        mv "$wasm.tmp" "$wasm"
    fi
    done_with "$wasm" "$src"
}

# js_world_guest NAME PKG/WORLD SOURCE: componentize-js, a guest with its own
# wit/world.wit on the 0.2.0 contract.
js_world_guest() {
    local name=$1 world=$2 wasm="$out/${1//-/_}.wasm" stage
    if ! fresh "$wasm" "$ex/$name"; then
        install_node
        stage="$(stage_wit "$ex/$name" "$contract_now")"
        timed "$name" "$componentize_js" --wit "$stage" --world-name "$world" \
            -d http fetch-event -o "$wasm.tmp" "$ex/$name/$3" >&2
        rm -rf "$stage"
        mv "$wasm.tmp" "$wasm"
    fi
    done_with "$wasm" "$ex/$name"
}

js_qjs_guest() { # componentize-qjs (QuickJS), future world
    local name=js-future-ticker wasm="$out/js_future_ticker.wasm" stage
    if ! fresh "$wasm" "$ex/$name"; then
        install_node
        stage="$(stage_wit "$ex/$name")"
        timed "$name" "$componentize_qjs" --wit "$stage" --world example:js-future-ticker/ticker \
            --js "$ex/$name/ticker.js" -o "$wasm.tmp" >&2
        rm -rf "$stage"
        mv "$wasm.tmp" "$wasm"
    fi
    done_with "$wasm" "$ex/$name"
}

c_guest() {
    local name=c-pollable-ticker wasm="$out/c_pollable_ticker.wasm" work
    if ! fresh "$wasm" "$ex/$name"; then
        install_c
        install_node # jco adapts the WASI preview-1 module to a component
        work="$(mktemp -d)"
        build() {
            "$wit_bindgen" c "$contract" --world baton:leader/pollable-plugin@0.1.0 \
                --out-dir "$work" >&2
            "$CLANG" --target=wasm32-wasi --sysroot=/usr -mexec-model=reactor -O2 \
                -I "$work" "$ex/$name/ticker.c" "$work/pollable_plugin.c" \
                "$work/pollable_plugin_component_type.o" -o "$work/ticker.core.wasm"
            "$jco" new "$work/ticker.core.wasm" --wasi-reactor -o "$wasm.tmp" >&2
        }
        timed "$name" build
        rm -rf "$work"
        mv "$wasm.tmp" "$wasm"
    fi
    done_with "$wasm" "$ex/$name"
}

# js_qjs_world_guest NAME PKG/WORLD SOURCE: componentize-qjs, a guest with
# its own wit/world.wit on the 0.2.0 contract.
js_qjs_world_guest() {
    local name=$1 world=$2 wasm="$out/${1//-/_}.wasm" stage
    if ! fresh "$wasm" "$ex/$name"; then
        install_node
        stage="$(stage_wit "$ex/$name" "$contract_now")"
        timed "$name" "$componentize_qjs" --wit "$stage" --world "$world" \
            --js "$ex/$name/$3" -o "$wasm.tmp" >&2
        rm -rf "$stage"
        mv "$wasm.tmp" "$wasm"
    fi
    done_with "$wasm" "$ex/$name"
}

# c_world_guest NAME PKG/WORLD SOURCE: a C guest with its own wit/world.wit
# on the 0.2.0 contract (wit-bindgen names its files after the world).
c_world_guest() {
    local name=$1 world=$2 source=$3 wasm="$out/${1//-/_}.wasm" work stage
    if ! fresh "$wasm" "$ex/$name"; then
        install_c
        install_node
        work="$(mktemp -d)"
        stage="$(stage_wit "$ex/$name" "$contract_now")"
        build() {
            local base=${world##*/}
            "$wit_bindgen" c "$stage" --world "$world" --out-dir "$work" >&2
            "$CLANG" --target=wasm32-wasi --sysroot=/usr -mexec-model=reactor -O2 \
                -I "$work" "$ex/$name/$source" "$work/$base.c" \
                "$work/${base}_component_type.o" -o "$work/$name.core.wasm"
            "$jco" new "$work/$name.core.wasm" --wasi-reactor -o "$wasm.tmp" >&2
        }
        timed "$name" build
        rm -rf "$work" "$stage"
        mv "$wasm.tmp" "$wasm"
    fi
    done_with "$wasm" "$ex/$name"
}

python_guest python-pollable-ticker pollable-plugin
python_guest python-future-ticker future-plugin
js_guest js-pollable-ticker js_pollable_ticker.wasm -d http fetch-event
js_qjs_guest
c_guest
# The same JavaScript guest built without `-d http fetch-event`: it imports
# wasi:http, which the host provides under grants (the tests check that it
# loads and that `baton check` names the import).
js_guest js-http-import js_http_import.wasm
# The key-value counters (baton:leader@0.2.0 plus wasi:keyvalue).
python_world_guest python-kv-counter example:python-kv-counter/counter
js_world_guest js-kv-counter example:js-kv-counter/counter counter.js
js_qjs_world_guest js-future-kv-counter example:js-future-kv-counter/counter counter.js
c_world_guest c-kv-counter example:c-kv-counter/counter counter.c

# Where the tools are, for the tests that build `baton new` templates.
{
    echo "componentize-py=$componentize_py"
    echo "componentize-js=$componentize_js"
    echo "jco=$jco"
    echo "wit-bindgen=$wit_bindgen"
    echo "clang=$(command -v "$CLANG" || true)"
} > "$out/tools.txt"
