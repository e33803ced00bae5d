"""What the sustained-load tests of Django and Flask ask of every server: the load, and the checks
on what it cost (``bench.load._sustained`` runs it). Counts and orderings, never durations."""

from __future__ import annotations

import pytest

from bench.load import _sustained
from stampede._async.reads import MOST_READS
from support.app_servers import SERVERS, Server

#: Clients asking at once, seconds of asking, the page's timeout and its render's length: about
#: four windows per page.
CLIENTS = 150
SECONDS = 5.0
TTL = 1
RENDER_SECONDS = 0.3
#: Redis connections one server process may hold, at most: its reads in flight (callers who come
#: while a GET of the page is in flight share the next one, and never more than MOST_READS are in
#: flight), the leader's commands and the subscriber. Not one per request waiting (up to 1,000 on
#: a gevent worker), nor the pool's 100. How many reads are in flight at once follows the
#: machine's load, not the code: 27 and 31 were seen with 40 threads per worker.
CONNECTIONS = MOST_READS + 10
#: Requests sent together for a cold page whose render is held open.
CROWD = 40


def check_meanwhile(served: _sustained.Served, path: str) -> None:
    """While :data:`CROWD` requests wait for the held render of the cold page ``path``, an uncached
    page is answered; then one render serves them all."""
    seen = _sustained.meanwhile(served, path, CROWD)
    assert seen.ping == (200, b"0"), "the uncached page waited for the render"
    assert seen.crowd == [(200, seen.crowd[0][1])] * CROWD, seen.crowd  # type: ignore[index]
    assert seen.begun == 1


def check_load(served: _sustained.Served, path: str) -> None:
    """Under the load, ``path`` is rendered at most once per window and at least twice (it expired
    meanwhile), every request gets a 200, and no server process holds many Redis connections."""
    outcome = _sustained.load(served, path, clients=CLIENTS, seconds=SECONDS)
    assert outcome.load.failed == 0, outcome.describe()
    assert not outcome.server_errors, outcome.describe()
    assert outcome.overlaps == [], outcome.describe()
    assert outcome.begun == len(outcome.renders), outcome.describe()  # none left unfinished
    assert len(outcome.renders) >= 2, outcome.describe()
    assert outcome.peak_connections <= CONNECTIONS, outcome.describe()


def server_named(name: str) -> Server:
    """The app server ``name``; the test fails, naming what to install, where it is missing."""
    server = SERVERS[name]
    missing = server.missing()
    if missing:
        pytest.fail(f"{server.described} needs {', '.join(missing)}: install the test extra")
    return server
