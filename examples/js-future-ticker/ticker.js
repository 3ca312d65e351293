// An example baton plugin in JavaScript (componentize-qjs, QuickJS) for the
// `future-plugin` world.
//
// While this host leads, it prints `tick term=T n=N` once a second. It waits
// on the change future and a one-second timer together (`Promise.race`), so
// it notices the end of its term at once, prints `stop term=T role=R` and
// returns.
//
// `PROBE_MODE=busy` (used by the test suite) makes it ignore the change in a
// compute loop instead, so that the host has to stop it by force.

import statusFuture from "baton:leader/status-future@0.1.0";
import clock from "wasi:clocks/monotonic-clock@0.3.0";
import environment from "wasi:cli/environment@0.2.12";
import stdout from "wasi:cli/stdout@0.2.12";

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

function mode() {
  for (const [k, v] of environment.getEnvironment()) {
    if (k === "PROBE_MODE") return v;
  }
  return "cooperative";
}

export const taskAsync = {
  async run(status) {
    const term = status.term;
    const m = mode();
    say(`start term=${term} mode=${m}`);
    if (m === "busy") {
      let x = 1;
      for (;;) x = (x * 1103515245 + 12345) % 2147483648;
    }
    // Watch first: if the status already differs from the one `run` got,
    // the term is over before it started; otherwise the future resolves,
    // with the new status, on the next change.
    let [now, change] = statusFuture.currentStatus();
    if (same(now, status)) {
      const changed = change.read().then((s) => ({ changed: s }));
      let n = 0;
      for (;;) {
        const r = await Promise.race([changed, clock.waitFor(SECOND_NS).then(() => null)]);
        if (r !== null) {
          now = r.changed;
          break;
        }
        n += 1;
        say(`tick term=${term} n=${n}`);
      }
    }
    say(`stop term=${term} role=${now.role}`);
  },
};
