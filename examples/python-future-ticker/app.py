"""An example baton plugin in Python for the `future-plugin` world.

While this host leads, it prints `tick term=T n=N` once a second. It waits
on the change future and a one-second timer together (`asyncio.wait` with
`FIRST_COMPLETED`), so it notices the end of its term at once, prints
`stop term=T role=R` and returns.

The timer is `wasi:clocks/monotonic-clock@0.3.0.wait-for`: `asyncio.sleep`
does not work in componentize-py's event loop (it has no `call_later`).

`PROBE_MODE=busy` (used by the test suite) makes it ignore the change in a
compute loop instead, so that the host has to stop it by force.

Build: componentize-py -d ../../wit -w baton:leader/future-plugin@0.1.0 \
           componentize app -o python_future_ticker.wasm
"""

import asyncio
import os

from componentize_py_async_support import spawn
from wit_world import exports
from wit_world.imports import monotonic_clock, status_future
from wit_world.imports.baton_leader_types import Status

SECOND_NS = 1_000_000_000


def say(line: str) -> None:
    print(line, flush=True)


async def _finish(pending: "asyncio.Future[None]") -> None:
    await pending


class TaskAsync(exports.TaskAsync):
    async def run(self, status: Status) -> None:
        term = status.term
        mode = os.environ.get("PROBE_MODE", "cooperative")
        say(f"start term={term} mode={mode}")
        if mode == "busy":
            x = term
            while True:
                x = (x * 6364136223846793005 + 1) & 0xFFFFFFFFFFFFFFFF

        # Watch first: if the status already differs from the one `run` got,
        # the term is over before it started; otherwise the future resolves,
        # with the new status, on the next change.
        now, change = status_future.current_status()
        if now == status:
            changed = asyncio.ensure_future(change.read())
            n = 0
            while True:
                timer = asyncio.ensure_future(monotonic_clock.wait_for(SECOND_NS))
                done, _ = await asyncio.wait(
                    [changed, timer], return_when=asyncio.FIRST_COMPLETED
                )
                if changed in done:
                    now = changed.result()
                    # componentize-py cannot cancel a pending import call,
                    # and the task may not end while one is pending (it
                    # traps with "resource has children"): let the timer
                    # finish after `run` has returned its result.
                    spawn(_finish(timer))
                    break
                n += 1
                say(f"tick term={term} n={n}")
        say(f"stop term={term} role={now.role.name.lower()}")
