// {{name}}: a baton plugin in JavaScript (componentize-js) for the
// `pollable-plugin` world.
//
// While this host leads, it prints `tick term=T n=N` once a second; it waits
// on the change pollable and the timer together, so it returns as soon as the
// term is over.

import { currentStatus } from "baton:leader/status-pollable@0.1.0";
import { subscribeDuration } from "wasi:clocks/monotonic-clock@0.2.12";
import { poll } from "wasi:io/poll@0.2.12";

function same(a, b) {
  return a.role === b.role && a.holder === b.holder && a.lease === b.lease && a.term === b.term;
}

export const taskSync = {
  run(status) {
    const term = status.term;
    console.log(`start term=${term}`);
    // Ready once the status differs from `now`; if `now` already differs
    // from the status `run` got, the term is over.
    let [now, change] = currentStatus();
    let n = 0;
    while (same(now, status)) {
      const timer = subscribeDuration(1_000_000_000n);
      if (poll([change, timer]).includes(0)) break;
      n += 1;
      console.log(`tick term=${term} n=${n}`);
    }
    [now] = currentStatus();
    console.log(`stop term=${term} role=${now.role}`);
  },
};
