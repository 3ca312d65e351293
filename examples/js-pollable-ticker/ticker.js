// An example baton plugin in JavaScript (componentize-js, StarlingMonkey)
// for the `pollable-plugin` world.
//
// While this host leads, it prints `tick term=T n=N` once a second. It waits
// on the change pollable and a one-second timer together (`poll`), so it
// notices the end of its term at once, prints `stop term=T role=R` and
// returns.
//
// `PROBE_MODE=busy` (used by the test suite) makes it ignore the change in a
// compute loop instead, so that the host has to stop it by force.

import { currentStatus } from "baton:leader/status-pollable@0.1.0";
import { subscribeDuration } from "wasi:clocks/monotonic-clock@0.2.12";
import { poll } from "wasi:io/poll@0.2.12";
import { getEnvironment } from "wasi:cli/environment@0.2.12";

const SECOND_NS = 1_000_000_000n;

function same(a, b) {
  return a.role === b.role && a.holder === b.holder && a.lease === b.lease && a.term === b.term;
}

function mode() {
  for (const [k, v] of getEnvironment()) {
    if (k === "PROBE_MODE") return v;
  }
  return "cooperative";
}

export const taskSync = {
  run(status) {
    const term = status.term;
    const m = mode();
    console.log(`start term=${term} mode=${m}`);
    if (m === "busy") {
      let x = 1;
      for (;;) x = (x * 1103515245 + 12345) % 2147483648;
    }
    // Watch first: if the status already differs from the one `run` got,
    // the term is over before it started; otherwise the pollable is ready
    // on the next change.
    let [now, change] = currentStatus();
    let n = 0;
    while (same(now, status)) {
      const timer = subscribeDuration(SECOND_NS);
      const ready = poll([change, timer]);
      if (ready.includes(0)) break;
      n += 1;
      console.log(`tick term=${term} n=${n}`);
    }
    [now] = currentStatus();
    console.log(`stop term=${term} role=${now.role}`);
  },
};
