"""One pub/sub connection per event loop and Redis client, for every asyncio waiter.

The asyncio twin of :mod:`stampede._subscriber`: a listener task owns the
connection and keeps one read pending on it at all times (never cancelled,
so no reply is ever cut in half); SUBSCRIBE and UNSUBSCRIBE are sent beside
that read, which redis-py's asyncio ``PubSub`` allows. Waiters sleep on their
watch's event. The task ends when nobody has waited for a while.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import Any

import redis.asyncio.cluster
import redis.exceptions

from ._aoperations import ask_sharded
from ._channels import Channels, Shards, WatchBase
from ._events import logger
from ._nodes import node_client

__all__ = ["AsyncSubscriber", "AsyncWatch", "async_subscriber_for", "close_sockets"]

IDLE_SECONDS = 10.0
_MAX_BACKOFF = 1.0


class AsyncWatch(WatchBase[asyncio.Event]):
    """A task's watch on one channel."""

    __slots__ = ()

    def __init__(self, channel: bytes) -> None:
        super().__init__(channel, asyncio.Event())

    async def wait(self, timeout: float) -> bool:
        if self.event.is_set():
            return True
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


class AsyncSubscriber:
    """The pub/sub listener of one ``redis.asyncio`` client, on its event loop."""

    def __init__(self, client: Any) -> None:
        self._client_ref = weakref.ref(client)
        self._channels: Channels[AsyncWatch] = Channels()
        self._task: asyncio.Task[None] | None = None
        self._poked = asyncio.Event()
        self._stopping = False
        self._link: _Classic | _Sharded | None = None  # while serving

    def watch(self, channel: bytes) -> AsyncWatch:
        """Start watching ``channel``; stop with :meth:`unwatch`."""
        watch = AsyncWatch(channel)
        self._channels.add(watch)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="stampede-subscriber")
        else:
            self._poked.set()
        return watch

    def unwatch(self, watch: AsyncWatch) -> None:
        self._channels.remove(watch)
        self._poked.set()

    async def aclose(self) -> None:
        """Stop the listener if nobody is waiting (it starts again when someone does)."""
        task = self._task
        if task is None or task.done() or len(self._channels):
            return
        # A flag rather than a cancellation, which redis-py's commands may
        # swallow when it lands inside them.
        self._stopping = True
        self._poked.set()
        try:
            await asyncio.wait({task}, timeout=1.0)
        finally:
            self._stopping = False
        if not task.done():
            task.cancel()

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            client = self._client_ref()
            if client is None:
                return
            try:
                await self._serve(client)
                if not len(self._channels):
                    return
                continue  # stopped as a waiter came in: serve it
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: the connection is gone
                logger.info("wake-up connection lost, reconnecting: %s", exc)
            finally:
                del client
            self._channels.lost()
            if not len(self._channels):
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    async def _serve(self, client: Any) -> None:
        loop = asyncio.get_running_loop()
        link = self._link = await _link(client)
        reads: dict[Any, asyncio.Future[Any]] = {}  # pub/sub connection -> its pending read
        poked: asyncio.Future[Any] | None = None
        abandoned = False
        try:
            channels = self._channels.resubscribed()
            await link.subscribe(channels if link.anchored else channels[1:])
            idle_since: float | None = None
            while not self._stopping:
                subscribe, unsubscribe = self._channels.take_pending()
                for gone in await link.unsubscribe(unsubscribe):
                    read = reads.pop(gone, None)
                    if read is not None:
                        read.cancel()
                await link.subscribe(subscribe)
                now = loop.time()
                if len(self._channels):
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= IDLE_SECONDS and not self._channels.pending:
                    return
                for pubsub in link.pubsubs():
                    if pubsub not in reads:
                        reads[pubsub] = asyncio.ensure_future(pubsub.get_message(timeout=None))
                if poked is None:
                    self._poked.clear()
                    poked = asyncio.ensure_future(self._poked.wait())
                done, _ = await asyncio.wait(
                    {*reads.values(), poked}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED
                )
                if poked in done:
                    poked = None
                for pubsub, read in list(reads.items()):
                    if read in done:
                        del reads[pubsub]
                        message = read.result()
                        link.check(message)
                        self._channels.dispatch(message)
        except GeneratorExit:
            # This task was destroyed with its event loop: nothing can be
            # awaited any more, so the sockets are closed as they are.
            abandoned = True
            raise
        finally:
            for pending in (*reads.values(), poked):
                if pending is not None:
                    with contextlib.suppress(RuntimeError):  # a closed loop
                        pending.cancel()
            self._link = None
            if abandoned:
                close_sockets([pubsub.connection for pubsub in link.pubsubs()])
            else:
                await link.aclose()

    def connections(self) -> list[Any]:
        """The pub/sub connections open now (for closing the sockets of a
        subscriber whose event loop closed under it)."""
        link = self._link
        pubsubs = link.pubsubs() if link is not None else []
        return [pubsub.connection for pubsub in pubsubs if pubsub.connection is not None]


async def _link(client: Any) -> _Classic | _Sharded:
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        sharded = await ask_sharded(client)
        if sharded is None:
            raise redis.exceptions.ConnectionError("cannot tell whether the cluster has sharded pub/sub")
        if sharded:
            return _Sharded(client)
    return _Classic(client)


class _Classic:
    """One pub/sub connection, classic channels (see :mod:`stampede._subscriber`)."""

    anchored = True

    def __init__(self, client: Any) -> None:
        self._pubsub = client.pubsub()

    async def subscribe(self, channels: list[bytes]) -> None:
        if channels:
            await self._pubsub.subscribe(*channels)

    async def unsubscribe(self, channels: list[bytes]) -> list[Any]:
        """Unsubscribe; the connections closed as left with no channel."""
        if channels:
            await self._pubsub.unsubscribe(*channels)
        return []

    def pubsubs(self) -> list[Any]:
        return [self._pubsub]

    def check(self, message: dict[str, Any] | None) -> None:
        pass

    async def aclose(self) -> None:
        with contextlib.suppress(BaseException):
            await asyncio.shield(self._pubsub.aclose())


class _Sharded:
    """Sharded pub/sub on a cluster, a connection per node with waiters."""

    anchored = False

    def __init__(self, cluster: Any) -> None:
        self._cluster = cluster
        self._shards = Shards(cluster.get_node_from_key)

    async def subscribe(self, channels: list[bytes]) -> None:
        shards = self._shards
        for node, group in shards.subscribing(channels):
            pubsub = shards.pubsubs.get(node.name)
            if pubsub is None:
                pubsub = shards.pubsubs[node.name] = node_client(self._cluster, node).pubsub()
            await pubsub.ssubscribe(*group)

    async def unsubscribe(self, channels: list[bytes]) -> list[Any]:
        groups, emptied = self._shards.unsubscribing(channels)
        for pubsub, group in groups:
            await pubsub.sunsubscribe(*group)
        for pubsub in emptied:
            await _close(pubsub)
        return emptied

    def pubsubs(self) -> list[Any]:
        return list(self._shards.pubsubs.values())

    def check(self, message: dict[str, Any] | None) -> None:
        self._shards.check(message)  # a slot that moved away: raises, to start over

    async def aclose(self) -> None:
        for pubsub in self._shards.pubsubs.values():
            await _close(pubsub)


def close_sockets(connections: list[Any]) -> None:
    """Close the sockets of ``redis.asyncio`` connections without their event
    loop (it is closed, or gone)."""
    for connection in connections:
        transport: Any = getattr(getattr(connection, "_writer", None), "transport", None)
        sock = getattr(transport, "_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
            # What transport.close() would record, had it a loop to run on.
            transport._sock = None
            transport._closing = True
        if connection is not None:
            connection._reader = connection._writer = None


async def _close(pubsub: Any) -> None:
    """Close a pub/sub connection and the pool of the node client it came from."""
    with contextlib.suppress(BaseException):
        await asyncio.shield(pubsub.aclose())
        await pubsub.connection_pool.disconnect()


_subscribers: weakref.WeakKeyDictionary[Any, AsyncSubscriber] = weakref.WeakKeyDictionary()


def async_subscriber_for(client: Any) -> AsyncSubscriber:
    """The subscriber for ``client`` (one per client, shared by every
    :class:`stampede.asyncio.Stampede` on it; a ``redis.asyncio`` client
    belongs to one event loop)."""
    found = _subscribers.get(client)
    if found is None:
        found = _subscribers[client] = AsyncSubscriber(client)
    return found
