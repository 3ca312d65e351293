// An example baton plugin in JavaScript (componentize-js, StarlingMonkey)
// for the `pollable-plugin` world that keeps its state across hand-overs in
// the plugin's key-value bucket.
//
// While this host leads, it adds one to the counter `ticks` of its
// `default` bucket once a second (`wasi:keyvalue/atomics.increment`) and
// prints `tick term=T total=N`. Each term runs in a fresh instance; the
// bucket outlives it, so a new leader's first tick prints the next total,
// never 1 again. A failed write (one from a term that is over is refused)
// ends the task with an error.
//
// Build: scripts/build-polyglot-guests.sh (js_kv_counter.wasm), which runs
// componentize-js --wit WIT --world-name example:js-kv-counter/counter
// -d http fetch-event -o js_kv_counter.wasm counter.js, with WIT this
// folder's wit/ plus baton's wit/ as deps. Run: see examples/kv-counter.toml
// and docs/state.md.

import { currentStatus } from "baton:leader/status-pollable@0.2.0";
import { subscribeDuration } from "wasi:clocks/monotonic-clock@0.2.12";
import { poll } from "wasi:io/poll@0.2.12";
import { open } from "wasi:keyvalue/store@0.2.0-draft2";
import { increment } from "wasi:keyvalue/atomics@0.2.0-draft2";

const SECOND_NS = 1_000_000_000n;

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

export const taskSync = {
  run(status) {
    const term = status.term;
    console.log(`start term=${term}`);
    let bucket;
    try {
      // The plugin's own bucket: granted without configuration.
      bucket = open("default");
    } catch (e) {
      // A thrown string is the `err` of `run`'s result.
      throw `open: ${why(e)}`;
    }
    let [now, change] = currentStatus();
    while (same(now, status)) {
      const timer = subscribeDuration(SECOND_NS);
      if (poll([change, timer]).includes(0)) break;
      let total;
      try {
        // s64 is a BigInt in JavaScript.
        total = increment(bucket, "ticks", 1n);
      } catch (e) {
        throw `increment: ${why(e)}`;
      }
      console.log(`tick term=${term} total=${total}`);
    }
    [now] = currentStatus();
    console.log(`stop term=${term} role=${now.role}`);
  },
};
