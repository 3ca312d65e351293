// {{name}}: a baton plugin in JavaScript (componentize-js) for the
// `pollable-plugin` world.
//
// While this host leads, it prints `tick term=T n=N` once a second; it waits
// on the change pollable and the timer together, so it returns as soon as the
// term is over.
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

import { currentStatus } from "baton:leader/status-pollable@0.2.0";
import { getEnvironment } from "wasi:cli/environment@0.2.12";
import { subscribeDuration } from "wasi:clocks/monotonic-clock@0.2.12";
import { poll } from "wasi:io/poll@0.2.12";

function same(a, b) {
  return a.role === b.role && a.holder === b.holder && a.lease === b.lease && a.term === b.term;
}

export const taskSync = {
  async run(status) {
    const term = status.term;
    console.log(`start term=${term}`);
    const reportUrl = new Map(getEnvironment()).get("REPORT_URL");
    // Ready once the status differs from `now`; if `now` already differs
    // from the status `run` got, the term is over.
    let [now, change] = currentStatus();
    let n = 0;
    while (same(now, status)) {
      const timer = subscribeDuration(1_000_000_000n);
      if (poll([change, timer]).includes(0)) break;
      n += 1;
      console.log(`tick term=${term} n=${n}`);
      if (reportUrl) {
        try {
          const response = await fetch(reportUrl, {
            method: "POST",
            headers: { "content-type": "application/json" },
            // The term is a BigInt (u64), which JSON cannot hold.
            body: JSON.stringify({ lease: status.lease, term: Number(term), tick: n }),
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
