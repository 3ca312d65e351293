"""{{name}}: a baton plugin in Python for the `pollable-plugin` world.

While this host leads, it prints `tick term=T n=N` once a second (the
setting `interval-ms` of its `config` table in `baton.toml` changes the
period); it waits on the change pollable and the timer together, so it
returns as soon as the term is over.

`N` counts the ticks of every term: it is kept in the plugin's own key-value
bucket (`default`), which outlives the instance, so the next leader, on this
host or another, goes on from where this one stopped. The host refuses a
write from a term that is over, and the task then ends with that error.

With `REPORT_URL` set (see `baton.toml`: the variable and an `http` grant),
each tick also sends `POST REPORT_URL` with a small JSON body over
`wasi:http` and prints `report status=S term=T n=N` (or `report error E
term=T n=N`). The host adds the lease and the term as `Baton-Lease` and
`Baton-Term` headers, so the receiver can refuse a stale leader.
"""

import json
import os
from typing import Optional

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports import atomics, monotonic_clock, outgoing_handler, poll, status_pollable
from wit_world.imports import wasi_config_store as config
from wit_world.imports import wasi_http_types as http
from wit_world.imports import wasi_keyvalue_store as kv
from wit_world.imports.baton_leader_types import Status
from wit_world.imports.streams import StreamError_Closed

MILLI_NS = 1_000_000


def why(e: Err) -> str:
    """The text of a `wasi:keyvalue` or `wasi:config` error raised as `Err`."""
    return str(getattr(e.value, "value", type(e.value).__name__.removeprefix("Error_")))


def setting(key: str, default: str) -> str:
    """The plugin's setting `key` (its `config` table), or `default`."""
    try:
        value = config.get(key)
    except Err as e:
        raise Err(f"config {key}: {why(e)}")
    return default if value is None else value


def post(url: str, body: bytes, change: poll.Pollable) -> Optional[int]:
    """POSTs `body` to `url` and returns the response's status, or None if
    the status changed first (the request is dropped then). Raises
    `RuntimeError` when the request fails (e.g. `HttpRequestDenied`: no
    grant allows `url`)."""
    scheme, _, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    headers = [("content-type", b"application/json"), ("content-length", str(len(body)).encode())]
    request = http.OutgoingRequest(http.Fields.from_list(headers))
    request.set_method(http.Method_Post())
    request.set_scheme(http.Scheme_Https() if scheme == "https" else http.Scheme_Http())
    request.set_authority(authority)
    request.set_path_with_query("/" + path if slash else "/")
    outgoing = request.body()
    try:
        pending = outgoing_handler.handle(request, None)
    except Err as e:
        raise RuntimeError(type(e.value).__name__.removeprefix("ErrorCode_"))
    with outgoing.write() as stream:
        stream.blocking_write_and_flush(body)  # small: at most 4096 bytes
    http.OutgoingBody.finish(outgoing, None)
    with pending:
        if 0 not in poll.poll([pending.subscribe(), change]):
            return None
        result = pending.get()
        assert isinstance(result, Ok)
        if isinstance(result.value, Err):
            raise RuntimeError(type(result.value.value).__name__.removeprefix("ErrorCode_"))
        with result.value.value as response:
            status = response.status()
            with response.consume() as incoming:
                with incoming.stream() as stream:
                    while True:  # read and discard the body
                        try:
                            if not stream.blocking_read(65536):
                                continue
                        except Err as e:
                            if isinstance(e.value, StreamError_Closed):
                                break
                            raise RuntimeError("reading the response body failed")
            return status


class TaskSync(exports.TaskSync):
    def run(self, status: Status) -> None:
        term = status.term
        print(f"start term={term}", flush=True)
        report_url = os.environ.get("REPORT_URL")
        interval_ns = int(setting("interval-ms", "1000")) * MILLI_NS
        # Ready once the status differs from `now`; if `now` already differs
        # from the status `run` got, the term is over.
        now, change = status_pollable.current_status()
        try:
            bucket = kv.open("default")
        except Err as e:
            raise Err(f"open: {why(e)}")
        while now == status:
            timer = monotonic_clock.subscribe_duration(interval_ns)
            if 0 in poll.poll([change, timer]):
                break
            # One atomic step in the store; fails once a newer term has
            # claimed the bucket.
            try:
                n = atomics.increment(bucket, "ticks", 1)
            except Err as e:
                raise Err(f"increment: {why(e)}")
            print(f"tick term={term} n={n}", flush=True)
            if report_url:
                body = json.dumps({"lease": status.lease, "term": term, "tick": n}).encode()
                try:
                    code = post(report_url, body, change)
                except RuntimeError as e:
                    print(f"report error {e} term={term} n={n}", flush=True)
                    continue
                if code is None:
                    break
                print(f"report status={code} term={term} n={n}", flush=True)
        now, _ = status_pollable.current_status()
        print(f"stop term={term} role={now.role.name.lower()}", flush=True)
