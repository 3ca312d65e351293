// {{name}}: a baton plugin in JavaScript (componentize-js) for the
// `pollable-plugin` world.
//
// While this host leads, it prints `tick term=T n=N` once a second (the
// setting `interval-ms` of its `config` table in baton.toml changes the
// period); it waits on the change pollable and the timer together, so it
// returns as soon as the term is over.
//
// `N` counts the ticks of every term: it is kept in the plugin's own
// key-value bucket (`default`), which outlives the instance, so the next
// leader, on this host or another, goes on from where this one stopped. The
// host refuses a write from a term that is over, and the task then ends
// with that error.
//
// With REPORT_URL set (see baton.toml: the variable and an `http` grant),
// each tick also sends `POST REPORT_URL` with a small JSON body with
// `fetch` and prints `report status=S term=T n=N` (or `report error E
// term=T n=N`). The host adds the lease and the term as Baton-Lease and
// Baton-Term headers, so the receiver can refuse a stale leader.
//
// `run` is async so that it can await `fetch`: componentize-js runs the
// event loop until the promise settles before the (sync) export returns.
// While a `fetch` is pending the change is not watched: keep requests short
// (the host drops a request still in flight when the grace is over).

import { currentStatus } from "baton:leader/status-pollable@0.3.0";
import { getEnvironment } from "wasi:cli/environment@0.2.12";
import { subscribeDuration } from "wasi:clocks/monotonic-clock@0.2.12";
import { poll } from "wasi:io/poll@0.2.12";
import { get as setting } from "wasi:config/store@0.2.0-rc.1";
import { increment } from "wasi:keyvalue/atomics@0.2.0-draft2";
import { open } from "wasi:keyvalue/store@0.2.0-draft2";

// The text of a wasi:keyvalue or wasi:config error: the import throws, and
// the `error` variant is the exception's `payload` ({ tag, val }).
function why(e) {
  const p = e.payload;
  if (p === undefined) return String(e);
  return p.val === undefined ? p.tag : p.val;
}

// Calls `f`; if it throws, throws "WHAT: WHY" instead (a thrown string is
// the `err` of `run`'s result).
function attempt(what, f) {
  try {
    return f();
  } catch (e) {
    throw `${what}: ${why(e)}`;
  }
}

function same(a, b) {
  return a.role === b.role && a.holder === b.holder && a.lease === b.lease && a.term === b.term;
}

export const taskSync = {
  async run(status) {
    const term = status.term;
    console.log(`start term=${term}`);
    const reportUrl = new Map(getEnvironment()).get("REPORT_URL");
    // A setting, with a default when the `config` table has none.
    const intervalMs = BigInt(attempt("config", () => setting("interval-ms")) ?? "1000");
    const bucket = attempt("open", () => open("default"));
    // Ready once the status differs from `now`; if `now` already differs
    // from the status `run` got, the term is over.
    let [now, change] = currentStatus();
    while (same(now, status)) {
      const timer = subscribeDuration(intervalMs * 1_000_000n);
      if (poll([change, timer]).includes(0)) break;
      // One atomic step in the store (s64: a BigInt); fails once a newer
      // term has claimed the bucket.
      const n = attempt("increment", () => increment(bucket, "ticks", 1n));
      console.log(`tick term=${term} n=${n}`);
      if (reportUrl) {
        try {
          const response = await fetch(reportUrl, {
            method: "POST",
            headers: { "content-type": "application/json" },
            // The term and the count are BigInts, which JSON cannot hold.
            body: JSON.stringify({ lease: status.lease, term: Number(term), tick: Number(n) }),
          });
          await response.text();
          console.log(`report status=${response.status} term=${term} n=${n}`);
        } catch (e) {
          console.log(`report error ${e} term=${term} n=${n}`);
        }
      }
    }
    [now] = currentStatus();
    console.log(`stop term=${term} role=${now.role}`);
  },
};
