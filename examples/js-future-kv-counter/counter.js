// An example baton plugin in JavaScript (componentize-qjs, QuickJS) for the
// `future-plugin` world that keeps its state across hand-overs in the
// plugin's key-value bucket.
//
// While this host leads, it adds one to the counter `ticks` of its
// `default` bucket once a second (`wasi:keyvalue/atomics.increment`) and
// prints `tick term=T total=N`. Each term runs in a fresh instance; the
// bucket outlives it, so a new leader's first tick prints the next total,
// never 1 again. A failed write (one from a term that is over is refused)
// ends the task with an error. The key-value calls are synchronous: no
// `await`.
//
// Build: scripts/build-polyglot-guests.sh (js_future_kv_counter.wasm),
// which runs componentize-qjs --wit WIT --world
// example:js-future-kv-counter/counter --js counter.js, with WIT this
// folder's wit/ plus baton's wit/ as deps. Run: see
// examples/kv-counter.toml and docs/state.md.

import statusFuture from "baton:leader/status-future@0.2.0";
import clock from "wasi:clocks/monotonic-clock@0.3.0";
import stdout from "wasi:cli/stdout@0.2.12";
import atomics from "wasi:keyvalue/atomics@0.2.0-draft2";
import store from "wasi:keyvalue/store@0.2.0-draft2";

// QuickJS under componentize-qjs has no `console`: write to wasi:cli/stdout.
// Taken on first use: the module's top level runs at build time (Wizer).
let out = null;
function say(line) {
  if (out === null) out = stdout.getStdout();
  const s = line + "\n";
  const bytes = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i) & 0x7f;
  out.blockingWriteAndFlush(bytes);
}

const SECOND_NS = 1_000_000_000;

function same(a, b) {
  return a.role === b.role && a.holder === b.holder && a.lease === b.lease && a.term === b.term;
}

// The text of a wasi:keyvalue error: the import throws, and the `error`
// variant is the exception's `payload` ({ tag, val }).
function why(e) {
  const p = e.payload;
  if (p === undefined) return String(e);
  return p.tag === "other" ? p.val : p.tag;
}

export const taskAsync = {
  async run(status) {
    const term = status.term;
    say(`start term=${term}`);
    let bucket;
    try {
      // The plugin's own bucket: granted without configuration.
      bucket = store.open("default");
    } catch (e) {
      // A thrown string is the `err` of `run`'s result.
      throw `open: ${why(e)}`;
    }
    let [now, change] = statusFuture.currentStatus();
    if (same(now, status)) {
      const changed = change.read().then((s) => ({ changed: s }));
      for (;;) {
        const r = await Promise.race([changed, clock.waitFor(SECOND_NS).then(() => null)]);
        if (r !== null) {
          now = r.changed;
          break;
        }
        let total;
        try {
          // s64 is a plain number under componentize-qjs.
          total = atomics.increment(bucket, "ticks", 1);
        } catch (e) {
          throw `increment: ${why(e)}`;
        }
        say(`tick term=${term} total=${total}`);
      }
    }
    say(`stop term=${term} role=${now.role}`);
  },
};
