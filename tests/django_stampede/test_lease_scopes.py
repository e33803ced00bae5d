"""A request's leases live exactly as long as the request, through the servers people deploy with.

A key read on every request and never written (a flag that is normally
absent) makes nobody wait: its lease is taken once, given back when that
request ends, and the key is then known as one that reads do not fill, so
the requests that follow miss at once. A render slower than ``LEASE_TTL``
keeps its lease (renewed while the request runs) and is rendered once per
window. Counts, never durations: the throughput beside Django's own
``RedisCache`` is ``python -m bench --scenario unwritten``.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from typing import Any

import pytest
import redis

from bench import _sustained
from bench._apps.sustained_config import flag_events
from bench._timeline import Render
from stampede.testing._app_servers import SERVERS, Server
from tests.django_stampede import workers
from tests.sustained import check_load

_namespaces = itertools.count()

CLIENTS = 150
SECONDS = 3.0
#: Each server, and the flag page it serves: the async view (``aget``) under
#: the ASGI servers, the sync one (``get``) under the WSGI ones.
FLAG_PAGES = {
    "gunicorn-gthread": "/flag",
    "gunicorn-gevent": "/flag",
    "uvicorn": "/aflag",
    "daphne": "/aflag",
    "hypercorn": "/aflag",
}


def _server(name: str) -> Server:
    server = SERVERS[name]
    missing = server.missing()
    if missing:
        pytest.fail(f"{server.described} needs {', '.join(missing)}: install the test extra")
    return server


def _namespace(what: str) -> str:
    return f"{what}{os.getpid()}-{next(_namespaces)}"


@pytest.mark.slow
@pytest.mark.parametrize("name", FLAG_PAGES)
def test_a_key_read_on_every_request_and_never_written_makes_nobody_wait(name: str, redis_url: str) -> None:
    namespace = _namespace("flag")
    with _sustained.app(
        _server(name),
        "django",
        backend="stampede",
        redis_url=redis_url,
        namespace=namespace,
        ttl=1,
        render_seconds=0.1,
    ) as served:
        load = _sustained.drive(served.port, FLAG_PAGES[name], clients=CLIENTS, seconds=SECONDS)
        served.app_server.check()
        errors = served.app_server.errors()
        log = served.app_server.output()
    with redis.Redis.from_url(redis_url) as client:
        counts = flag_events(client, namespace)
    assert load.failed == 0, dict(load.statuses)
    assert not errors, errors
    assert load.requests > CLIENTS, load.requests  # every client was answered, and asked again
    # The first request's get took the lease; when it ended without a set,
    # the key was remembered as one that reads do not fill: nobody took the
    # lease again (before, each request took it in turn, the others queued).
    assert counts.get("lease_won", 0) <= 2, counts
    assert counts.get("unfilled", 0) >= 1, counts
    assert counts.get("wait_timeout", 0) == 0, counts
    assert "waited" not in log


@pytest.mark.slow
@pytest.mark.parametrize(("name", "path"), [("gunicorn-gthread", "/page"), ("uvicorn", "/apage")])
def test_a_render_slower_than_its_lease_is_rendered_once_per_window(
    name: str, path: str, redis_url: str
) -> None:
    # A render of two and a half lease times: renewed while its request
    # runs, so no waiter takes the lease over and renders it again, and
    # none times out.
    with _sustained.app(
        _server(name),
        "django",
        backend="stampede",
        redis_url=redis_url,
        namespace=_namespace("slow"),
        ttl=1,
        render_seconds=2.5,
        lease_ttl=1.0,
    ) as served:
        check_load(served, path)
        assert "waited" not in served.app_server.output()


PROCESSES = 4
_spawn = multiprocessing.get_context("spawn")


def _run_workers(target: Any, *args: Any) -> list[Any]:
    barrier = _spawn.Barrier(PROCESSES)
    queue = _spawn.Queue()
    processes = [_spawn.Process(target=target, args=(*args, barrier, queue)) for _ in range(PROCESSES)]
    for process in processes:
        process.start()
    try:
        return [queue.get(timeout=120) for _ in processes]
    finally:
        for process in processes:
            process.join(30)


@pytest.mark.slow
def test_worker_processes_reading_a_key_nobody_sets_never_wait_for_each_other(redis_url: str) -> None:
    namespace = _namespace("workers-flag")
    seen = _run_workers(workers.read_flag, redis_url, namespace, f"{namespace}:events", 100)
    with redis.Redis.from_url(redis_url) as client:
        counts = {kind.decode(): int(n) for kind, n in client.hgetall(f"{namespace}:events").items()}
    assert seen == [[None] * 100] * PROCESSES
    # Outside requests a get's lease belongs to its thread: its next read of
    # the key, 10 ms later, gives it back, and the key is known unfilled.
    assert counts.get("lease_won", 0) <= 2, counts
    assert counts.get("wait_timeout", 0) == 0, counts
    assert counts.get("unfilled", 0) >= PROCESSES * 100 - 2 * PROCESSES, counts


@pytest.mark.slow
def test_cache_aside_in_worker_processes_renders_once_per_window(redis_url: str) -> None:
    namespace = _namespace("workers-aside")
    served = _run_workers(workers.cache_aside, redis_url, namespace, f"{namespace}:events", 4.0, 0.3)
    with redis.Redis.from_url(redis_url) as client:
        logged = [tuple(map(float, line.split())) for line in client.lrange(f"{namespace}:renders", 0, -1)]
    renders = [Render(start, end) for start, end in sorted(logged)]
    assert all(body == "rendered" for bodies in served for body in bodies)
    assert len(renders) >= 2  # it expired meanwhile
    assert _sustained.window_overlaps(renders, ttl=1) == []
