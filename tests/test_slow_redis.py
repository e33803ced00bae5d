"""A slow Redis costs a read one round trip, not two.

Redis is slowed for real: its replies pass through a proxy that holds them
back (``support.proxies.LagProxy``), and the proxy counts what the client sends, so
each test counts round trips, never durations.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import stampede
from stampede._core.keys import KeySpace
from stampede.testing import RedisServer
from support.proxies import LagProxy
from tests.drivers import AsyncDriver
from tests.helpers import wait_until

#: What every GET of the namespace's state sends.
NAMESPACE_STATE = b"{}:tag"


def _open_connections(sf: Any, count: int) -> None:
    """Put ``count`` connections, made and idle, in the pool of driver ``sf``'s client."""
    pool = sf.client.connection_pool
    if isinstance(sf, AsyncDriver):

        async def made() -> None:
            connections = [await pool.get_connection() for _ in range(count)]
            for connection in connections:
                await pool.release(connection)

        sf.run(made())
        return
    connections = [pool.get_connection() for _ in range(count)]
    for connection in connections:
        pool.release(connection)


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[LagProxy]:
    with LagProxy(server.port) as lagging:
        yield lagging


def test_a_read_asks_for_a_lapsed_namespace_state_in_the_same_round_trip(
    make_driver: Any, proxy: LagProxy, keys: KeySpace
) -> None:
    # Every entry is judged by the namespace's state (invalidate_all). Known
    # for tag_check_interval once read; past it, a read of an entry asks for
    # the state in the same round trip: one chunk on the wire, not two trips.
    sf = make_driver(proxy.url, tag_check_interval=0.05, near_cache=None)
    sf.set("k", "v", ttl=60)
    entry = keys("k").value
    before = len(proxy.sent())
    for _ in range(5):
        time.sleep(0.06)  # the state lapses
        assert sf.get_or_rebuild("k", lambda: "rebuilt", ttl=60) == "v"
        time.sleep(0.06)
        assert sf.get("k").value == "v"
    chunks = [data for data in proxy.sent()[before:] if entry in data]
    assert len(chunks) == 10
    assert all(NAMESPACE_STATE in data for data in chunks)


def test_a_caller_does_not_wait_for_another_callers_reply_to_send_its_own_get(
    make_driver: Any, proxy: LagProxy, keys: KeySpace
) -> None:
    # Every reply held back: a caller that came while a GET of its key is in
    # flight must not wait for that reply (a round trip) before it sends the
    # GET it shares with the others who came.
    sf = make_driver(proxy.url, near_cache=None, redis_options={"socket_timeout": 30})
    sf.set("k", "v", ttl=60)
    entry = keys("k").value
    _open_connections(sf, 3)  # a new connection's handshake would be held back too
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        proxy.lag = 60.0
        before = proxy.requests(entry)
        first = pool.submit(sf.get_or_rebuild, "k", lambda: "rebuilt", ttl=60)
        wait_until(lambda: proxy.requests(entry) > before)
        sent = proxy.requests(entry)
        later = [pool.submit(sf.get_or_rebuild, "k", lambda: "rebuilt", ttl=60) for _ in range(3)]
        # Sent while the first reply is still held back.
        wait_until(lambda: proxy.requests(entry) > sent)
        proxy.release()
        assert first.result(30) == "v"
        assert [future.result(30) for future in later] == ["v"] * 3
    # Shared, or one each: never a GET per caller and more.
    assert proxy.requests(entry) - sent <= 3


class _HeldAfterLookup(dict):  # type: ignore[type-arg]
    """The instance's GETs in flight, by key; the thread ``held`` is stopped, once, just after it
    looked one up, until ``go`` is set (a thread the OS holds up at that point)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: threading.Thread | None = None
        self.looked = threading.Event()
        self.go = threading.Event()

    def get(self, key: Any, default: Any = None) -> Any:
        found = super().get(key, default)
        if threading.current_thread() is self.held and not self.looked.is_set():
            self.looked.set()
            self.go.wait(30)
        return found


def test_a_thread_held_up_while_the_read_it_would_share_is_sent_and_answered_gets_that_reply(
    proxy: LagProxy, keys: KeySpace, namespace: str
) -> None:
    # A caller that finds a GET of its key in flight joins the next GET, sent by the first caller
    # who came. Should the joining thread be held up between finding the GET in flight and joining,
    # long enough for that next GET to be sent and answered, it takes that reply: it was sent
    # after it asked. It used to wait for an event nobody would ever set: a request hung.
    sf = stampede.Stampede(redis.Redis.from_url(proxy.url, socket_timeout=30), namespace=namespace)
    got: dict[str, Any] = {}

    def read(name: str) -> None:
        got[name] = sf.get("k")

    try:
        sf.set("k", "v", ttl=60)
        entry = keys("k").value
        _open_connections(sf, 3)
        pending = sf._reads._pending = _HeldAfterLookup()
        proxy.lag = 60.0
        before = proxy.requests(entry)
        first = threading.Thread(target=read, args=("first",), daemon=True)
        first.start()  # its reply is held back
        wait_until(lambda: proxy.requests(entry) > before)
        late = threading.Thread(target=read, args=("late",), daemon=True)
        pending.held = late
        late.start()
        assert pending.looked.wait(30)  # it found the first GET in flight
        proxy.lag = 0.0
        # The next caller sends the next GET (the first's reply still held back) and has it.
        assert sf.get("k").value == "v"
        pending.go.set()
        late.join(30)
        assert not late.is_alive(), "the held-up caller never got an answer"
        assert got["late"].value == "v"
        proxy.release()
        first.join(30)
        assert got["first"].value == "v"
    finally:
        proxy.release()
        sf.close()
        sf.client.close()
