"""``django_stampede.cache_page`` under a real ASGI server (uvicorn, in a
process of its own): async pages rendered once for a crowd, cold or stale,
and the server answering other requests meanwhile; Django's own
``cache_page`` on an async view beside it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from django.core.cache import cache
from django.test import override_settings

from tests.django_stampede.asgi_server import AsgiServer
from tests.django_stampede.test_cache_page import stale_serving
from tests.django_stampede.test_views import expire_all


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AsgiServer]:
    """The test project under uvicorn; this process sees the same cache.
    Indirect parameters: more ``OPTIONS`` for the cache."""
    entry = stale_serving()
    entry["OPTIONS"].update(getattr(request, "param", {}))
    config = {"default": entry}
    with override_settings(CACHES=config):
        try:
            with AsgiServer(config, tmp_path / "uvicorn.log") as running:
                yield running
        finally:
            cache.clear()


async def eventually(condition: Callable[[], Awaitable[bool]], timeout: float = 10) -> None:
    """Poll ``condition`` until true; fail after ``timeout`` (a bound, not a measurement)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def crowd(
    server: AsgiServer, page: str, n: int, timeout: float = 30
) -> asyncio.Future[list[tuple[int, str]]]:
    """``n`` requests for ``page``, sent together."""
    return asyncio.gather(*[server.get(page, timeout=timeout) for _ in range(n)])


# redis-py 8's asyncio pool opens at most 100 connections (max_connections)
# and raises MaxConnectionsError beyond, rather than waiting for one: crowds
# of 200 and 400 on the default pool show no request needs one of its own.


@pytest.mark.parametrize(
    ("n", "server"),
    [
        (50, {}),
        (200, {}),
        (400, {}),
    ],
    indirect=["server"],
    ids=["50", "200", "400"],
)
async def test_a_missing_page_of_an_async_view_is_rendered_once_for_a_crowd(
    server: AsgiServer, n: int
) -> None:
    replies = await crowd(server, "/async-page/", n)
    assert replies == [(200, "render 1")] * n, server.output()
    assert await server.renders() == 1


async def test_a_stale_page_of_an_async_view_is_rendered_once_and_served_stale_meanwhile(
    server: AsgiServer,
) -> None:
    assert await server.get("/async-page/") == (200, "render 1")
    expire_all()
    await server.renders(gate="close")  # the rebuild will not finish until the others are answered
    try:
        rebuilder = asyncio.ensure_future(server.get("/async-page/"))

        async def rebuilding() -> bool:
            return await server.renders() == 2

        await eventually(rebuilding)
        replies = await crowd(server, "/async-page/", 40)
        rebuilt_meanwhile = rebuilder.done()
    finally:
        await server.renders(gate="open")
    assert replies == [(200, "render 1")] * 40, server.output()
    assert not rebuilt_meanwhile
    assert await rebuilder == (200, "render 2")
    assert await server.renders() == 2
    assert await server.get("/async-page/") == (200, "render 2")


async def test_the_server_answers_other_requests_while_a_page_is_built(server: AsgiServer) -> None:
    await server.renders(gate="close")
    try:
        waiting = crowd(server, "/async-page/", 20)

        async def building() -> bool:
            return await server.renders() == 1

        await eventually(building)
        # One request renders, held by the gate; nineteen wait for its page.
        # None of them holds up the event loop:
        assert await server.get("/ping/", timeout=10) == (200, "pong")
        assert not waiting.done()
    finally:
        await server.renders(gate="open")
    assert await waiting == [(200, "render 1")] * 20, server.output()
    assert await server.renders() == 1


async def test_djangos_own_cache_page_on_an_async_view_never_stalls_the_server(server: AsgiServer) -> None:
    # Django's decorator calls the cache's blocking get() on the event loop's
    # thread: the backend must never wait there, or every request stalls.
    bound = 20  # seconds: a bound on a page that renders in 0.3 s, not a measurement
    cold = crowd(server, "/stock-async-page/", 30, timeout=bound)
    assert await server.get("/ping/", timeout=bound) == (200, "pong")
    assert {status for status, _ in await cold} == {200}, server.output()

    status, page = await server.get("/stock-async-page/", timeout=bound)
    assert status == 200
    before = await server.renders()
    expire_all()
    await server.renders(gate="close")
    try:
        rebuilder = asyncio.ensure_future(server.get("/stock-async-page/", timeout=bound))

        async def rebuilding() -> bool:
            return await server.renders() == before + 1

        await eventually(rebuilding)
        stale = await crowd(server, "/stock-async-page/", 29, timeout=bound)
        assert await server.get("/ping/", timeout=bound) == (200, "pong")
    finally:
        await server.renders(gate="open")
    assert stale == [(200, page)] * 29, server.output()
    assert (await rebuilder)[0] == 200
    assert await server.renders() == before + 1
