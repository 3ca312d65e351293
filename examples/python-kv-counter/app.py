"""An example baton plugin in Python for the `pollable-plugin` world that
keeps its state across hand-overs in the plugin's key-value bucket.

While this host leads, it adds one to the counter `ticks` of its `default`
bucket once a second (`wasi:keyvalue/atomics.increment`) and prints
`tick term=T total=N`. Each term runs in a fresh instance; the bucket
outlives it, so a new leader's first tick prints the next total, never 1
again. A failed write (one from a term that is over is refused) ends the
task with `Err` (the host retries it while the term lasts).

Build: scripts/build-polyglot-guests.sh (python_kv_counter.wasm), which
runs componentize-py -d WIT -w example:python-kv-counter/counter
componentize app, with WIT this folder's wit/ plus baton's wit/ as deps.
Run: see examples/kv-counter.toml and docs/state.md.
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import atomics, monotonic_clock, poll, status_pollable, store
from wit_world.imports.types import Status

SECOND_NS = 1_000_000_000


def say(line: str) -> None:
    print(line, flush=True)


def why(e: Err) -> str:
    """The text of a `wasi:keyvalue` error raised as `Err`."""
    if isinstance(e.value, store.Error_Other):
        return e.value.value
    if isinstance(e.value, store.Error_AccessDenied):
        return "access-denied"
    return "no-such-store"


class TaskSync(exports.TaskSync):
    def run(self, status: Status) -> None:
        term = status.term
        say(f"start term={term}")
        # The plugin's own bucket: granted without configuration.
        try:
            bucket = store.open("default")
        except Err as e:
            raise Err(f"open: {why(e)}")
        now, change = status_pollable.current_status()
        with bucket:
            while now == status:
                timer = monotonic_clock.subscribe_duration(SECOND_NS)
                if 0 in poll.poll([change, timer]):
                    break
                try:
                    total = atomics.increment(bucket, "ticks", 1)
                except Err as e:
                    raise Err(f"increment: {why(e)}")
                say(f"tick term={term} total={total}")
        now, _ = status_pollable.current_status()
        say(f"stop term={term} role={now.role.name.lower()}")
