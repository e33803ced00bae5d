"""A request's leases live exactly as long as the request, through the servers people deploy with.

A key read on every request and never written (a flag that is normally
absent) makes nobody wait: its lease is taken once, given back when that
request ends, and the key is then known as one that reads do not fill, so
the requests that follow miss at once. A render slower than ``LEASE_TTL``
keeps its lease (renewed while the request runs) and is rendered once per
window. Counts, never durations: the throughput beside Django's own
``RedisCache`` is ``python -m bench unwritten``.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import time
from typing import Any

import django_stampede
import pytest
import redis
from django.core.cache import caches
from django.test import Client, override_settings

from bench.load import _sustained
from bench.load._apps.sustained_config import flag_events
from bench.load._timeline import Render
from stampede._protocol.scripts import UNFILLED
from tests.django_stampede import workers
from tests.helpers import lease_held, lease_token
from tests.sustained import check_load, server_named

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


def _namespace(what: str) -> str:
    return f"{what}{os.getpid()}-{next(_namespaces)}"


@pytest.mark.slow
@pytest.mark.parametrize("name", FLAG_PAGES)
def test_a_key_read_on_every_request_and_never_written_makes_nobody_wait(name: str, redis_url: str) -> None:
    namespace = _namespace("flag")
    with _sustained.app(
        server_named(name),
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
        server_named(name),
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


def _cache_entry(**options: Any) -> dict[str, Any]:
    options.setdefault("NAMESPACE", _namespace("scope"))
    return {
        "BACKEND": "django_stampede.StampedeCache",
        "LOCATION": os.environ["STAMPEDE_TEST_REDIS_URL"],
        "OPTIONS": options,
    }


def _lease_key(cache: Any, key: str) -> bytes | None:
    """What the lease key of ``key`` holds: a lease's record, a mark, or nothing."""
    core = cache.stampede
    raw: bytes | None = core.client.get(core._keys(cache.make_key(key)).lease)
    return raw


def _lease_token(cache: Any, key: str) -> bytes | None:
    """The token of the lease held on ``key`` (``None``: none, or lapsed)."""
    core = cache.stampede
    name = core._keys(cache.make_key(key)).lease
    return lease_token(core.client, name) if lease_held(core.client, name) else None


def test_lease_scope_outside_requests_renews_and_commits() -> None:
    with override_settings(CACHES={"default": _cache_entry(LEASE_TTL=1.0)}):
        cache = caches["default"]
        with django_stampede.lease_scope():
            assert cache.get("report") is None
            token = _lease_token(cache, "report")
            assert token is not None
            time.sleep(3.0)  # three lease times: renewed while the block runs
            assert _lease_token(cache, "report") == token
            cache.set("report", "rendered")
        assert cache.get("report") == "rendered"
        assert _lease_token(cache, "report") is None
        cache.clear()


def test_lease_scope_that_never_sets_leaves_the_key_unfilled() -> None:
    with override_settings(CACHES={"default": _cache_entry()}):
        cache = caches["default"]
        with django_stampede.lease_scope():
            assert cache.get("flag") is None
        assert _lease_key(cache, "flag") == UNFILLED.encode()
        with django_stampede.lease_scope():
            assert cache.get("flag") is None  # at once, without a lease
            assert _lease_key(cache, "flag") == UNFILLED.encode()
        cache.clear()


def test_lease_scope_that_raises_gives_its_leases_back_plainly() -> None:
    with override_settings(CACHES={"default": _cache_entry()}):
        cache = caches["default"]

        def task() -> None:
            with django_stampede.lease_scope():
                cache.get("page")  # a miss: the block holds the lease
                raise RuntimeError("task failed")

        with pytest.raises(RuntimeError, match="task failed"):
            task()
        assert _lease_token(cache, "page") is None
        cache.clear()


async def test_async_lease_scope_settles_on_the_event_loop() -> None:
    with override_settings(CACHES={"default": _cache_entry()}):
        cache = caches["default"]
        async with django_stampede.lease_scope():
            assert await cache.aget("flag") is None
            assert _lease_token(cache, "flag") not in (None, UNFILLED.encode())
        assert _lease_key(cache, "flag") == UNFILLED.encode()
        async with django_stampede.lease_scope():
            assert await cache.aget("page") is None
            await cache.aset("page", "rendered")
        assert await cache.aget("page") == "rendered"
        await cache.aclear()


def test_a_task_that_ended_no_longer_owns_its_threads_leases() -> None:
    # Outside requests, a thread's leases belong to one asyncio task at a
    # time, until it ends: ended, not gone (something may still refer to it).
    with override_settings(CACHES={"default": _cache_entry()}):
        cache = caches["default"]
        ended: list[asyncio.Task[Any]] = []

        async def first_script() -> None:
            ended.append(asyncio.current_task())  # type: ignore[arg-type]
            await cache.aget("elsewhere")

        assert cache.get("before") is None  # the thread's unit of work begins
        asyncio.run(first_script())  # the script's task: the thread's unit, while it runs
        assert cache.get("page") is None  # the thread's read: it holds the lease
        # The next script's task is the thread's own: it never waits for the
        # thread's lease, and the thread's write then stores.
        assert asyncio.run(cache.aget("page", "default")) == "default"
        cache.set("page", "rendered")
        assert cache.get("page") == "rendered"
        assert ended[0].done()
        cache.clear()


def test_a_request_that_first_uses_the_cache_settles_its_leases(redis_url: str) -> None:
    # Nothing touched the cache at start-up: the backend's request receivers
    # were connected during the first request, after it had started. That
    # request's lease is still the request's: given back when it ends.
    queue = _spawn.Queue()
    process = _spawn.Process(
        target=workers.first_request_reads_a_flag, args=(redis_url, _namespace("first"), queue)
    )
    process.start()
    try:
        assert queue.get(timeout=120) == UNFILLED.encode()
    finally:
        process.join(30)
    assert process.exitcode == 0


def test_a_header_list_outlives_its_page() -> None:
    # When the page expires, requests still find its header list, read the
    # page's key and render under that key's one lease: were the header list
    # gone at about the same time, a request holding its lease would render
    # the page beside the one holding the page's.
    with override_settings(CACHES={"default": _cache_entry()}):
        cache = caches["default"]
        core = cache.stampede
        assert Client().get("/page/").status_code == 200
        names = {name.decode() for name in core.client.scan_iter(match=f"{core.namespace}:*")}
        [header] = [name for name in names if "cache_header" in name and "}:" not in name]
        [page] = [name for name in names if "cache_page" in name and "}:" not in name]
        options = core.options
        assert core.client.pttl(header) > core.client.pttl(page) + options.max_lease_time * 1000 - 5000
        cache.clear()
