"""An example baton plugin in Python for the `pollable-plugin` world.

While this host leads, it prints `tick term=T n=N` once a second. It waits
on the change pollable and a one-second timer together (`poll.poll`), so it
notices the end of its term at once, prints `stop term=T role=R` and
returns.

`PROBE_MODE=busy` (used by the test suite) makes it ignore the change in a
compute loop instead, so that the host has to stop it by force.

Build: componentize-py -d ../../wit -w baton:leader/pollable-plugin@0.1.0 \
           componentize app -o python_pollable_ticker.wasm
"""

import os
import sys

from wit_world import exports
from wit_world.imports import monotonic_clock, poll, status_pollable
from wit_world.imports.types import Status

SECOND_NS = 1_000_000_000


def say(line: str) -> None:
    print(line, flush=True)


class TaskSync(exports.TaskSync):
    def run(self, status: Status) -> None:
        term = status.term
        mode = os.environ.get("PROBE_MODE", "cooperative")
        say(f"start term={term} mode={mode}")
        if mode == "busy":
            x = term
            while True:
                x = (x * 6364136223846793005 + 1) & 0xFFFFFFFFFFFFFFFF

        # Watch first: if the status already differs from the one `run` got,
        # the term is over before it started; otherwise the pollable fires on
        # the next change.
        now, change = status_pollable.current_status()
        n = 0
        while now == status:
            timer = monotonic_clock.subscribe_duration(SECOND_NS)
            ready = poll.poll([change, timer])
            if 0 in ready:
                break
            n += 1
            say(f"tick term={term} n={n}")
        now, _ = status_pollable.current_status()
        say(f"stop term={term} role={now.role.name.lower()}")
