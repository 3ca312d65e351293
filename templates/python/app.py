"""{{name}}: a baton plugin in Python for the `pollable-plugin` world.

While this host leads, it prints `tick term=T n=N` once a second; it waits
on the change pollable and the timer together, so it returns as soon as the
term is over.
"""

from wit_world import exports
from wit_world.imports import monotonic_clock, poll, status_pollable
from wit_world.imports.types import Status

SECOND_NS = 1_000_000_000


class TaskSync(exports.TaskSync):
    def run(self, status: Status) -> None:
        term = status.term
        print(f"start term={term}", flush=True)
        # Ready once the status differs from `now`; if `now` already differs
        # from the status `run` got, the term is over.
        now, change = status_pollable.current_status()
        n = 0
        while now == status:
            timer = monotonic_clock.subscribe_duration(SECOND_NS)
            if 0 in poll.poll([change, timer]):
                break
            n += 1
            print(f"tick term={term} n={n}", flush=True)
        now, _ = status_pollable.current_status()
        print(f"stop term={term} role={now.role.name.lower()}", flush=True)
