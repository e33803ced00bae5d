"""Small tools for concurrent tests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
import redis.cluster

from stampede import PickleSerializer, Stampede
from stampede._core.codec import encode
from stampede._core.envelope import HEADER_SIZE, MAC_SIZE, TAGGED, read_block
from stampede._core.near import CHECK_SECONDS


class Rebuilds:
    """A rebuild function that counts its runs (thread-safe) and can be slow or fail."""

    def __init__(self, result: Callable[[int], Any] = lambda n: f"v{n}", delay: float = 0.0) -> None:
        self.result = result
        self.delay = delay
        self.count = 0
        self.started = threading.Event()
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        with self._lock:
            self.count += 1
            n = self.count
        self.started.set()
        if self.delay:
            time.sleep(self.delay)
        return self.result(n)


class AsyncRebuilds:
    """:class:`Rebuilds` as a coroutine function (its delay awaited)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.count = 0

    async def __call__(self) -> str:
        self.count += 1
        n = self.count
        await asyncio.sleep(self.delay)
        return f"v{n}"


async def run_tasks(n: int, target: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Run ``target()`` in ``n`` tasks at once; their results (or the exceptions raised)."""
    return await asyncio.gather(*(target() for _ in range(n)), return_exceptions=True)


def run_threads(n: int, target: Callable[[], Any], *, timeout: float = 60) -> list[Any]:
    """Run ``target`` in ``n`` threads released together; return results (or
    the exceptions raised). Fails if any thread is still running after ``timeout``."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def work(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    stuck = sum(thread.is_alive() for thread in threads)
    assert stuck == 0, f"{stuck} of {n} callers still blocked after {timeout}s"
    return results


#: How long after another process's write returned a near cache may still
#: serve what it overwrote (stampede._core.near.CHECK_SECONDS).
COHERENCE_BOUND = CHECK_SECONDS


def due(returned: Sequence[float], written: int, began: float) -> int:
    """The newest of the writes ``1..written`` (``returned[i]``: when write ``i``
    returned, monotonic) that had returned :data:`COHERENCE_BOUND` or more
    before ``began``: what a read that began then must see, or newer."""
    while written > 0 and returned[written] > began - COHERENCE_BOUND:
        written -= 1
    return written


def past_the_coherence_bound() -> None:
    """Let the coherence bound pass after a write of another instance, so that
    a read must see it (see :data:`COHERENCE_BOUND`)."""
    time.sleep(COHERENCE_BOUND * 2)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` until true; fail after ``timeout`` (a bound, not a measurement)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def traceback_depth(error: BaseException) -> int:
    depth, tb = 0, error.__traceback__
    while tb is not None:
        depth, tb = depth + 1, tb.tb_next
    return depth


#: Appended to when a :class:`Planted` value is unpickled: what a forged value would run.
RAN: list[str] = []


def _ran(marker: str) -> None:
    RAN.append(marker)


class Planted:
    """Unpickling this calls :func:`_ran`: a stand-in for an attacker's code."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ran, ("planted",))


def namespace_version(client: redis.Redis, namespace: str) -> int:
    """The version of ``namespace``'s state, as anyone who can read Redis can read it (made
    first, as any write would, if the namespace has none yet)."""
    name = f"{namespace}:{{}}:tag"
    if client.get(name) is None:
        with Stampede(client, namespace=namespace) as maker:
            maker.set("made-the-namespace's-state", 1, ttl=1)
    raw = client.get(name)
    assert isinstance(raw, bytes)
    return int(raw.split(b":")[0])


def plant_pickle(client: redis.Redis, name: bytes | str) -> None:
    """Put, under the value name ``name`` (``<namespace>:{<key>``), a pickle that runs code when
    loaded, recording its namespace's version as stampede's own values do."""
    raw = name.encode() if isinstance(name, str) else name
    namespace = raw[: raw.index(b"{") - 1].decode()
    client.set(raw, planted_pickle(namespace_version(client, namespace)))


def planted_pickle(namespace_version: int = 0) -> bytes:
    """An unsigned envelope as stampede writes it, of the namespace whose state has version
    ``namespace_version`` (see :func:`namespace_version`), holding a pickle that runs code when
    loaded."""
    return encode(
        PickleSerializer(),
        Planted(),
        fresh_until=9e9,
        created_at=0.0,
        duration=0.0,
        namespace=namespace_version,
    )


def commands_processed(admin: redis.Redis) -> int:
    """Commands the server has processed, its PINGs left out (the near cache's
    heartbeats, health checks): each call counts itself too (an INFO)."""
    stats = admin.info("commandstats")
    return sum(int(stat["calls"]) for name, stat in stats.items() if name != "cmdstat_ping")


def close_core(core: Any) -> None:
    """Close a blocking core that does not own its client (the Flask extension's, the
    Flask-Caching backend's), and the client: every connection it opened."""
    core.close()
    client = core.client
    client.close()
    if isinstance(client, redis.cluster.RedisCluster):
        # Made from a URL, its nodes' clients were given pools they do not close.
        for node in client.get_nodes():
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        sentinel.close()


class DatabaseDown(Exception):
    """What the rebuilds of the tests raise while their database is down."""


def failing(attempts: list[int], delay: float = 0.0, started: threading.Event | None = None) -> Any:
    """A rebuild that counts its calls in ``attempts`` and raises
    :class:`DatabaseDown` (after ``delay`` seconds, ``started`` set first)."""

    def rebuild() -> Any:
        attempts.append(1)
        if started is not None:
            started.set()
        if delay:
            threading.Event().wait(delay)
        raise DatabaseDown("could not connect to server")

    return rebuild


def lease_record(client: redis.Redis, lease: bytes) -> tuple[bytes, int] | None:
    """The lease record at ``lease`` (a lease key's name): its holder's token and the server time
    (ms) it is held until; ``None`` if the key holds no record (none, or a mark)."""
    raw = client.get(lease)
    if not isinstance(raw, bytes) or raw.count(b":") < 2 or raw.startswith(b"!"):
        return None
    token, until, _ = raw.split(b":", 3)[:3]
    return token, int(until)


def lease_token(client: redis.Redis, lease: bytes) -> bytes | None:
    """The token of the lease recorded at ``lease``, held or lapsed; ``None`` if none."""
    record = lease_record(client, lease)
    return None if record is None else record[0]


def lease_held(client: redis.Redis, lease: bytes, token: str | None = None) -> bool:
    """Whether a lease (``token``'s, if given) is held at ``lease`` now, by the server's clock:
    recorded, and not lapsed."""
    record = lease_record(client, lease)
    if record is None or (token is not None and record[0] != token.encode()):
        return False
    seconds, micros = client.time()
    return record[1] > seconds * 1000 + micros // 1000


def payload_of(raw: bytes, *, signed: bool = False) -> bytes:
    """The payload of the stored value ``raw``: after its header and its tag block (every value
    has one: its namespace's version at least), before its signature."""
    at = HEADER_SIZE
    if raw[0] & TAGGED:
        at = read_block(raw, HEADER_SIZE)[2]
    return raw[at : len(raw) - (MAC_SIZE if signed else 0)]
