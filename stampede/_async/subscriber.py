"""One pub/sub connection per event loop and Redis client, for every asyncio waiter.

The asyncio twin of :mod:`stampede._sync.subscriber`: a listener task owns the
connection and keeps one read pending on it at all times (never cancelled,
so no reply is ever cut in half); SUBSCRIBE and UNSUBSCRIBE are sent beside
that read, which redis-py's asyncio ``PubSub`` allows. Waiters sleep on their
watch's event. The task ends when nobody has waited for a while.

Near caches (:mod:`stampede._core.near`) are kept coherent through the same
connection, as in :mod:`stampede._sync.subscriber`. A near hit does not wait for
the listener task: it asks :meth:`AsyncSubscriber.quiet` whether anything
waits unread on the connection (in the socket, in the stream's buffer, or
parsed in part) and goes to Redis if so, which also lets the listener run.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import time
import weakref
from typing import Any

import redis.asyncio.cluster
import redis.exceptions

from .._core.channels import Channels, Shards, WatchBase
from .._core.events import logger
from .._core.near import HEARTBEAT_SECONDS, NearStore, Tracked
from .._redis.nodes import node_client
from .._sync.subscriber import INVALIDATIONS
from .server import async_ask_sharded

__all__ = ["AsyncSubscriber", "AsyncWatch", "async_subscriber_for", "close_sockets"]

IDLE_SECONDS = 10.0
_MAX_BACKOFF = 1.0
#: Turns of the event loop a near read gives the listener to read what is
#: pending: the socket is read on one, the listener runs on the next.
_SETTLE_TURNS = 4
#: Seconds a connection is given to close cleanly before its socket is closed.
_CLOSE_SECONDS = 1.0


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
        # Near caches kept coherent through this connection (CLIENT TRACKING).
        self._tracked = Tracked()
        self._retrack = False  # a store was added: the link starts over with its prefix

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="stampede-subscriber")
        else:
            self._poked.set()

    def watch(self, channel: bytes) -> AsyncWatch:
        """Start watching ``channel``; stop with :meth:`unwatch`."""
        watch = AsyncWatch(channel)
        self._channels.add(watch)
        self._start()
        return watch

    def track(self, store: NearStore) -> None:
        """Keep ``store`` coherent: invalidations of its prefix drop its copies.
        It is live (served from) once tracking is on and confirmed; the
        listener starts now, or (made off the event loop) on the first read."""
        self._tracked.stores.append(store)
        self._retrack = True
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # Made outside the event loop: started by the first read, or
            # told now if it runs (from another thread, then).
            task = self._task
            if task is not None and not task.done():
                task.get_loop().call_soon_threadsafe(self._poked.set)
            return
        self._start()

    def untrack(self, store: NearStore) -> None:
        if store in self._tracked.stores:
            self._tracked.stores.remove(store)
        store.flush(live=False)

    def quiet(self) -> bool:
        """Whether no invalidation waits unread on the connection, so a near
        copy may be served: what every near hit asks first. ``False``: go to
        Redis (which lets the listener task read what is pending)."""
        link = self._tracked.link
        if link is None or not self._tracked.heartbeat.quiet(time.monotonic()):
            return False
        return not link.pending()

    def revive(self) -> None:
        """Start the listener if near caches are tracked and it is not running
        (the instance was made outside the event loop). Asked by reads while
        a near cache is not live."""
        if self._tracked.stores and (self._task is None or self._task.done()):
            self._start()

    async def settled(self) -> bool:
        """:meth:`quiet`, after letting the listener read what is pending for a
        few turns of the event loop (cheaper than a round trip to Redis, and a
        fill under way would be dropped by an invalidation it reads later)."""
        for _ in range(_SETTLE_TURNS):
            if self.quiet():
                return True
            await asyncio.sleep(0)
        return self.quiet()

    def _set_live(self, link: _Classic | _Sharded) -> None:
        if isinstance(link, _Classic):
            self._tracked.live(link, time.monotonic())

    def _set_dead(self) -> None:
        self._tracked.dead()

    def unwatch(self, watch: AsyncWatch) -> None:
        self._channels.remove(watch)
        self._poked.set()

    async def aclose(self) -> None:
        """Stop the listener if nobody is waiting (it starts again when someone does)."""
        task = self._task
        if task is None or task.done() or len(self._channels) or self._tracked.stores:
            return
        # A flag rather than a cancellation, which redis-py's commands may
        # swallow when it lands inside them.
        self._stopping = True
        self._poked.set()
        try:
            # Its connections close within _CLOSE_SECONDS each.
            await asyncio.wait({task}, timeout=4 * _CLOSE_SECONDS)
            if not task.done():
                connections = self.connections()
                task.cancel()
                await asyncio.wait({task}, timeout=_CLOSE_SECONDS)
                if not task.done():
                    close_sockets(connections)  # not left open when the loop closes
        finally:
            self._stopping = False

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            client = self._client_ref()
            if client is None:
                return
            try:
                await self._serve(client)
                if not (len(self._channels) or self._tracked.stores) or self._stopping:
                    return
                continue  # stopped as a waiter came in, or to track a new prefix
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: the connection is gone
                logger.info("wake-up connection lost, reconnecting: %s", exc)
            finally:
                self._set_dead()
                del client
            self._channels.lost()
            if not (len(self._channels) or self._tracked.stores):
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
            prefixes = sorted({store.prefix for store in self._tracked.stores})  # once each: see _subscriber
            self._retrack = False
            now = time.monotonic()
            if prefixes and isinstance(link, _Classic) and self._tracked.may_track(now):
                try:
                    redirected = await link.track(prefixes, self._tracked.invalidated)
                except redis.exceptions.ResponseError as exc:
                    self._tracked.refused(exc, now)
                else:
                    self._tracked.accepted()
                    if redirected:
                        channels.append(INVALIDATIONS)  # RESP2: live once subscribed
                    else:
                        self._set_live(link)  # RESP3: pushed on this connection from now on
            await link.subscribe(channels if link.anchored else channels[1:])
            idle_since: float | None = None
            while not (self._stopping or self._retrack or self._tracked.retry_due(time.monotonic())):
                subscribe, unsubscribe = self._channels.take_pending()
                for gone in await link.unsubscribe(unsubscribe):
                    read = reads.pop(gone, None)
                    if read is not None:
                        read.cancel()
                await link.subscribe(subscribe)
                now = loop.time()
                if len(self._channels) or self._tracked.stores:
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= IDLE_SECONDS and not self._channels.pending:
                    return
                for pubsub in link.pubsubs():
                    if pubsub not in reads:
                        reads[pubsub] = asyncio.ensure_future(self._receive(link, pubsub))
                if poked is None:
                    self._poked.clear()
                    poked = asyncio.ensure_future(self._poked.wait())
                tracking = isinstance(link, _Classic) and link.tracking
                done, _ = await asyncio.wait(
                    {*reads.values(), poked},
                    timeout=HEARTBEAT_SECONDS if tracking else 1.0,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if poked in done:
                    poked = None
                for pubsub, read in list(reads.items()):
                    if read in done:
                        del reads[pubsub]
                        read.result()  # raises what the read raised
                if tracking:
                    assert isinstance(link, _Classic)
                    if not link.same_stream():
                        # redis-py reconnected on its own, without tracking: what was
                        # written meanwhile was never told. Start over.
                        raise redis.exceptions.ConnectionError("the tracking connection was replaced")
                    try:
                        payload = self._tracked.heartbeat.due(time.monotonic())
                    except TimeoutError as exc:
                        raise redis.exceptions.TimeoutError(str(exc)) from None
                    if payload is not None:
                        await link.ping(payload)
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
            self._set_dead()
            if abandoned:
                close_sockets([pubsub.connection for pubsub in link.pubsubs()])
            else:
                await link.aclose()

    async def _receive(self, link: _Classic | _Sharded, pubsub: Any) -> None:
        """Read one message and act on it in the same step, so that nothing
        read is left waiting for the listener's next turn unseen by
        :meth:`quiet`."""
        message = await pubsub.get_message(timeout=None)
        link.check(message)
        if message is not None and message.get("type") == "pong":
            if self._tracked.heartbeat.answered(message.get("data")):
                return
        if message is not None and message.get("channel") == INVALIDATIONS:
            if message.get("type") == "message":
                self._tracked.invalidated(message["data"])
            elif message.get("type") == "subscribe" and isinstance(link, _Classic):
                self._set_live(link)
            return
        self._channels.dispatch(message)

    def connections(self) -> list[Any]:
        """The pub/sub connections open now (for closing the sockets of a
        subscriber whose event loop closed under it)."""
        link = self._link
        pubsubs = link.pubsubs() if link is not None else []
        return [pubsub.connection for pubsub in pubsubs if pubsub.connection is not None]


async def _link(client: Any) -> _Classic | _Sharded:
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        sharded = await async_ask_sharded(client)
        if sharded is None:
            raise redis.exceptions.ConnectionError("cannot tell whether the cluster has sharded pub/sub")
        if sharded:
            return _Sharded(client)
    return _Classic(client)


class _Classic:
    """One pub/sub connection, classic channels (see :mod:`stampede._sync.subscriber`)."""

    anchored = True

    def __init__(self, client: Any) -> None:
        self._pubsub = client.pubsub()
        self._stream: Any = None  # the tracking connection's, once tracking
        self._poll: Any = None

    async def track(self, prefixes: list[bytes], invalidated: Any) -> bool:
        """``CLIENT TRACKING`` in broadcast mode on ``prefixes`` (see
        :meth:`stampede._sync.subscriber._Classic.track`)."""
        pubsub = self._pubsub
        await pubsub.execute_command("CLIENT", "ID")  # connects
        own_id = await pubsub.parse_response(block=True)
        connection = pubsub.connection
        parser = connection._parser
        watched = [part for prefix in prefixes for part in (b"PREFIX", prefix)]
        resp3 = str(getattr(connection, "protocol", 2)) == "3"
        if resp3 and hasattr(parser, "set_invalidation_push_handler"):

            async def pushed(push: list[Any]) -> None:
                invalidated(push[1])

            parser.set_invalidation_push_handler(pushed)
            await pubsub.execute_command("CLIENT", "TRACKING", "ON", "BCAST", *watched)
            redirected = False
        else:
            await pubsub.execute_command("CLIENT", "TRACKING", "ON", "REDIRECT", own_id, "BCAST", *watched)
            redirected = True
        reply = await pubsub.parse_response(block=True)
        if reply not in (b"OK", "OK"):
            raise redis.exceptions.ResponseError(f"CLIENT TRACKING refused: {reply!r}")
        self._stream = connection._reader
        sock = connection._writer.transport.get_extra_info("socket")
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        return redirected

    @property
    def tracking(self) -> bool:
        return self._stream is not None

    async def ping(self, payload: bytes) -> None:
        """Send a PING beside the pending read; its answer comes as a ``pong``."""
        await self._pubsub.ping(payload)

    def same_stream(self) -> bool:
        """Whether the connection is still the one tracking was turned on for."""
        connection = self._pubsub.connection
        return connection is not None and connection._reader is self._stream

    def pending(self) -> bool:
        """Whether anything may wait unread on the connection: bytes in the
        socket, in the stream's buffer, or read by the parser but not yet
        made into a message."""
        stream = self._stream
        connection = self._pubsub.connection
        if stream is None or connection is None or connection._reader is not stream:
            return True  # not tracking, or reconnected behind our back (without tracking)
        if stream._buffer or stream.at_eof():
            return True
        parser = connection._parser
        if getattr(parser, "_buffer", None) or getattr(parser, "_chunks", None):
            return True
        reader = getattr(parser, "_reader", None)
        if reader is not None and hasattr(reader, "has_data") and reader.has_data():
            return True
        return bool(self._poll.poll(0))

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
        self._stream = None
        connection = self._pubsub.connection
        with contextlib.suppress(BaseException):
            # Bounded: closing waits for unsent bytes, which a stalled peer never takes.
            await asyncio.wait_for(asyncio.shield(self._pubsub.aclose()), _CLOSE_SECONDS)
        if connection is not None and connection._writer is not None:
            close_sockets([connection])


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
