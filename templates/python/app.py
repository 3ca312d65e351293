"""{{name}}: a baton plugin in Python for the `pollable-plugin` world.

While this host leads, it prints `tick term=T n=N` once a second; it waits
on the change pollable and the timer together, so it returns as soon as the
term is over.

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
from wit_world.imports import monotonic_clock, outgoing_handler, poll, status_pollable
from wit_world.imports import wasi_http_types as http
from wit_world.imports.baton_leader_types import Status
from wit_world.imports.streams import StreamError_Closed

SECOND_NS = 1_000_000_000


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
