"""{{name}}: a baton plugin in Python for the `future-plugin` world.

While this host leads, it prints `tick term=T n=N` once a second; it awaits
the change future and a one-second timer together, so it returns as soon as
the term is over.

The timer is `wasi:clocks/monotonic-clock@0.3.0.wait-for`: `asyncio.sleep`
does not work in componentize-py's event loop (it has no `call_later`).
"""

import asyncio

from componentize_py_async_support import spawn
from wit_world import exports
from wit_world.imports import monotonic_clock, status_future
from wit_world.imports.baton_leader_types import Status

SECOND_NS = 1_000_000_000


async def _finish(pending: "asyncio.Future[None]") -> None:
    await pending


class TaskAsync(exports.TaskAsync):
    async def run(self, status: Status) -> None:
        term = status.term
        print(f"start term={term}", flush=True)
        # Resolves, with the new status, on the next change; if `now`
        # already differs from the status `run` got, the term is over.
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
                    # A pending import call cannot be cancelled, and the task
                    # may not end while one is pending: let the timer finish
                    # after `run` has returned.
                    spawn(_finish(timer))
                    break
                n += 1
                print(f"tick term={term} n={n}", flush=True)
        print(f"stop term={term} role={now.role.name.lower()}", flush=True)
