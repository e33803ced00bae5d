"""One pub/sub connection per Redis client, for every waiter of a process.

Written once, for asyncio (``stampede/_async/subscriber.py``: one subscriber
per client, so per event loop); the blocking twin (``stampede/_sync/``) is
generated from it by ``python tools/unasync.py``. What differs between the
two (a listener task or thread, how it waits for its sockets, who may read
them) is in :mod:`stampede._primitives`.

Waiting for someone else's rebuild must not cost a connection per waiter:
redis-py's pool holds at most 100 and raises when empty, and a stampede is
hundreds of callers. A listener owns the one pub/sub connection (one per
node with sharded pub/sub on a cluster); waiters register a
:class:`AsyncWatch` and sleep on its event, which the listener sets when a
message for its channel arrives, when the subscription is confirmed, and
when the connection is lost or restored. A lost connection therefore never
loses a wake-up: every waiter looks at Redis again and the listener
subscribes anew. The listener stops when nobody has waited for a while, and
starts again on the next wait.

Near caches (:mod:`stampede._core.near`) are kept coherent through the same
connection (``CLIENT TRACKING``). A near hit does not wait for the listener:
it asks :meth:`AsyncSubscriber.quiet` whether anything waits unread on the
connection, and goes to Redis if so.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import redis.exceptions

from .._core.channels import Channels, Shards, WatchBase
from .._core.events import logger
from .._core.near import HEARTBEAT_SECONDS, Heartbeat, NearStore, Tracked
from .._core.tags import TagStates
from .._primitives import (
    AsyncEvent,
    AsyncListener,
    AsyncSectionLock,
    AsyncTrackingConnection,
    Message,
    async_close_node_pubsub,
    async_close_pubsub,
    async_forks_with,
    async_sleep,
)
from .._protocol.clients import is_cluster
from .._protocol.nodes import node_client
from .server import async_ask_sharded

__all__ = ["AsyncSubscriber", "AsyncWatch", "async_subscriber_for"]

#: Seconds without waiters after which the listener closes its connection.
IDLE_SECONDS = 10.0
_MAX_BACKOFF = 1.0
#: Where Redis publishes invalidations redirected to a RESP2 connection.
INVALIDATIONS = b"__redis__:invalidate"


class AsyncWatch(WatchBase[AsyncEvent]):
    """A waiter's watch on one channel."""

    __slots__ = ()

    def __init__(self, channel: bytes) -> None:
        super().__init__(channel, AsyncEvent())

    async def wait(self, timeout: float) -> bool:
        return await self.event.wait(timeout)


class AsyncSubscriber:
    """The pub/sub listener of one redis-py client."""

    def __init__(self, client: Any) -> None:
        self._client_ref = weakref.ref(client)
        # Guards the bookkeeping below between the listener and its callers.
        self._lock = AsyncSectionLock()
        self._channels: Channels[AsyncWatch] = Channels()
        self._listener = AsyncListener(self._act)
        self._link: _ClassicConnection | _ShardConnections | None = None  # while serving
        # Near caches kept coherent through this connection (CLIENT TRACKING).
        self._tracked = Tracked()
        self._retrack = False  # a store was added: the link starts over with its prefix
        self._stopping = False  # asked by aclose(): the listener ends (and starts anew for newcomers)
        self._closed = False  # its client is gone: never started again

    # --- what waiters and near caches call ---------------------------------------

    def watch(self, channel: bytes) -> AsyncWatch:
        """Start watching ``channel``; stop with :meth:`unwatch`."""
        watch = AsyncWatch(channel)
        with self._lock:
            self._channels.add(watch)
            started = self._start_locked()
        if not started:
            self._listener.poke()
        return watch

    def unwatch(self, watch: AsyncWatch) -> None:
        with self._lock:
            self._channels.remove(watch)
        self._listener.poke()

    def track(self, store: NearStore | TagStates) -> None:
        """Keep ``store`` coherent: invalidations of its prefix drop its copies.
        It is live (served from) once tracking is on and confirmed. Made off
        the event loop (asyncio), the listener starts on the first read."""
        if isinstance(store, NearStore):
            store.tracked = self._tracked  # whose checks its hot index trusts
        with self._lock:
            self._tracked.stores.append(store)
            self._retrack = True
            started = self._start_locked()
        if not started:
            self._listener.poke()

    def untrack(self, store: NearStore | TagStates) -> None:
        with self._lock:
            if store in self._tracked.stores:
                self._tracked.stores.remove(store)
        store.flush(live=False)

    def quiet(self) -> bool:
        """Whether no invalidation waits unread on the connection, so a near
        copy may be served: what every near hit asks first. ``False``: go to
        Redis (which lets an asyncio listener read what is pending; a
        blocking caller reads it here, see the listener's ``drained``)."""
        tracked = self._tracked
        tracking = tracked.link
        now = time.monotonic()
        if tracking is None or not tracked.heartbeat.quiet(now):
            return False
        if tracking.pending() and not self._listener.drained(tracking, tracked):
            return False
        if tracked.link is tracking:
            tracked.quiet_at(now)  # checked before the poll: what was read by then is acted on
        return True

    async def settled(self) -> bool:
        """:meth:`quiet`, once the listener has had the chance to read what is
        pending (a fill under way would be dropped by an invalidation it reads
        later)."""
        return await self._listener.settled(self.quiet)

    def revive(self) -> None:
        """Start the listener if near caches are tracked and it is not running
        (an asyncio instance made off its event loop; a blocking one after a
        fork). Asked by reads while a near cache is not live."""
        if self._tracked.stores and self._listener.running is None and not self._closed:
            with self._lock:
                self._start_locked()

    async def aclose(self) -> None:
        """Stop the listener if nobody waits or tracks (it starts again when
        someone does)."""
        with self._lock:
            running = self._listener.running
            if running is None or self._wanted():
                return
            # A flag the listener reads between its steps, rather than an
            # asyncio cancellation, which redis-py's commands may swallow.
            self._stopping = True
        self._listener.poke()
        await self._listener.join(running, self.connections)

    def connections(self) -> list[Any]:
        """The pub/sub connections open now (for closing the sockets of a
        subscriber whose event loop closed under it)."""
        link = self._link
        pubsubs = link.pubsubs() if link is not None else []
        return [pubsub.connection for pubsub in pubsubs if pubsub.connection is not None]

    def _forked(self) -> None:
        """In a child process just forked: the listener did not come along,
        and the connections and wake-up sockets are the parent's (left to it:
        not read, written or shut down here). Starts anew on demand."""
        self._lock = AsyncSectionLock()
        self._listener = AsyncListener(self._act)
        self._channels = Channels()
        self._link = None
        self._tracked.link = None
        self._tracked.heartbeat = Heartbeat()
        self._retrack = bool(self._tracked.stores)
        self._stopping = False
        for store in self._tracked.stores:
            store.forked()

    def _wanted(self) -> bool:
        return bool(len(self._channels) or self._tracked.stores)

    def _start_locked(self) -> bool:
        """Start the listener unless it runs or its client is gone (the caller
        holds the lock). Returns whether it started it."""
        if self._closed or self._listener.running is not None:
            return False
        return self._listener.start(self._run)

    # --- the listener ----------------------------------------------------------------

    async def _run(self) -> None:
        """The listener's life. On its way out, if a waiter came in as it
        stopped, a new listener starts for it."""
        finished = False
        try:
            await self._serve_while_wanted()
            finished = True
        finally:
            with self._lock:
                self._listener.ended()
                self._stopping = False
                if finished and self._wanted():
                    self._start_locked()

    async def _serve_while_wanted(self) -> None:
        """Serve a link, and a new one after each loss, until nobody waits or
        tracks, or the client is gone."""
        backoff = 0.05
        while True:
            client = self._client_ref()
            if client is None:
                # The client is gone, and with it any use for this subscriber:
                # it must not be started again (a listener a turn).
                with self._lock:
                    self._closed = True
                return
            try:
                if not await self._serve(client):
                    return  # idle, or asked to stop
                continue  # to track a new prefix, or to ask for tracking again
            except Exception as exc:  # any failure: the connection is gone
                logger.info("wake-up connection lost, reconnecting: %s", exc)
            finally:
                del client
            with self._lock:
                self._channels.lost()
                if self._stopping or not self._wanted():
                    return
            await async_sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    async def _serve(self, client: Any) -> bool:
        """Serve one link until idle or asked to stop (``False``), or until
        tracking is to be asked for anew (``True``: start over)."""
        link = await _open_link(client, self._listener)
        async with self._listener.listening(link):
            self._link = link
            try:
                await self._subscribe_all(link)
                return await self._listen(link)
            finally:
                self._tracked.dead()
                self._link = None

    async def _subscribe_all(self, link: _ClassicConnection | _ShardConnections) -> None:
        """On a new link: tracking for the near caches, then every channel watched."""
        with self._lock:
            channels = self._channels.resubscribed()
            # Once each: Redis refuses a prefix given twice (two instances, one namespace).
            prefixes = sorted({store.prefix for store in self._tracked.stores})
            self._retrack = False
        now = time.monotonic()
        async with self._listener.io:
            if prefixes and isinstance(link, _ClassicConnection) and self._tracked.may_track(now):
                try:
                    redirected = await link.track(prefixes, self._tracked.invalidated, self._listener.io)
                except redis.exceptions.ResponseError as exc:
                    self._tracked.refused(exc, now)
                else:
                    self._tracked.accepted()
                    if redirected:
                        channels.append(INVALIDATIONS)  # RESP2: live once subscribed
                    else:
                        self._set_live(link)  # RESP3: pushed on this connection from now on
            await link.subscribe(channels if link.anchored else channels[1:])

    async def _listen(self, link: _ClassicConnection | _ShardConnections) -> bool:
        idle_since: float | None = None
        while True:
            with self._lock:
                if self._stopping:
                    return False
                if self._retrack or self._tracked.retry_due(time.monotonic()):
                    return True  # start over, tracking the new prefix or asking again
                subscribe, unsubscribe = self._channels.take_pending()
                wanted = self._wanted()
            async with self._listener.io:
                await link.unsubscribe(unsubscribe)
                await link.subscribe(subscribe)
            now = time.monotonic()
            if wanted:
                idle_since = None
            elif idle_since is None:
                idle_since = now
            elif now - idle_since >= IDLE_SECONDS:
                with self._lock:
                    if not (self._wanted() or self._channels.pending):
                        return False
            tracking = link.tracking if isinstance(link, _ClassicConnection) else None
            timeout = HEARTBEAT_SECONDS if tracking is not None else 1.0
            await self._listener.wait(link.pubsubs(), tracking, timeout)
            if tracking is not None:
                assert isinstance(link, _ClassicConnection)
                if not tracking.current():
                    # redis-py reconnected on its own, without tracking: what was
                    # written meanwhile was never told. Start over.
                    raise redis.exceptions.ConnectionError("the tracking connection was replaced")
                try:
                    payload = self._tracked.heartbeat.due(time.monotonic())
                except TimeoutError as exc:
                    raise redis.exceptions.TimeoutError(str(exc)) from None
                if payload is not None:
                    async with self._listener.io:
                        await link.ping(payload)

    def _act(self, message: Message) -> None:
        """Act on one message read from the link."""
        if message is None:
            return
        link = self._link
        if link is None:
            return  # read as the link closed: every waiter is told it was lost
        link.check(message)
        kind = message.get("type")
        if kind == "pong" and self._tracked.heartbeat.answered(message.get("data")):
            return
        if message.get("channel") == INVALIDATIONS:
            if kind == "message":
                self._tracked.invalidated(message["data"])
            elif kind == "subscribe":
                self._set_live(link)
            return
        with self._lock:
            self._channels.dispatch(message)

    def _set_live(self, link: _ClassicConnection | _ShardConnections) -> None:
        if isinstance(link, _ClassicConnection) and link.tracking is not None:
            self._tracked.live(link.tracking, time.monotonic())


async def _open_link(client: Any, listener: AsyncListener) -> _ClassicConnection | _ShardConnections:
    if is_cluster(client):
        sharded = await async_ask_sharded(client)
        if sharded is None:
            raise redis.exceptions.ConnectionError("cannot tell whether the cluster has sharded pub/sub")
        if sharded:
            return _ShardConnections(client, listener)
    return _ClassicConnection(client)


class _ClassicConnection:
    """One pub/sub connection, classic channels (``SUBSCRIBE``), near caches'
    ``CLIENT TRACKING`` on it too."""

    anchored = True  # see ANCHOR_PREFIX

    def __init__(self, client: Any) -> None:
        self.pubsub = client.pubsub()
        #: The connection as near hits see it, once tracking is on.
        self.tracking: AsyncTrackingConnection | None = None

    async def track(self, prefixes: list[bytes], invalidated: Any, io: Any) -> bool:
        """``CLIENT TRACKING`` in broadcast mode on ``prefixes``, sent before
        anything is subscribed (RESP2 refuses it after). Returns whether the
        invalidations come on :data:`INVALIDATIONS` (RESP2, redirected to this
        very connection), rather than pushed to ``invalidated`` (RESP3)."""
        pubsub = self.pubsub
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
        self.tracking = AsyncTrackingConnection(pubsub, io)
        return redirected

    async def ping(self, payload: bytes) -> None:
        """Send a PING; its answer comes as a ``pong`` message."""
        await self.pubsub.ping(payload)

    async def subscribe(self, channels: list[bytes]) -> None:
        if channels:
            await self.pubsub.subscribe(*channels)

    async def unsubscribe(self, channels: list[bytes]) -> None:
        if channels:
            await self.pubsub.unsubscribe(*channels)

    def pubsubs(self) -> list[Any]:
        return [self.pubsub]

    def check(self, message: dict[str, Any]) -> None:
        pass

    async def aclose(self) -> None:
        self.tracking = None
        await async_close_pubsub(self.pubsub)


class _ShardConnections:
    """A cluster with sharded pub/sub: each channel subscribed (``SSUBSCRIBE``)
    on the node that owns its slot, one connection per node with waiters."""

    anchored = False  # see Shards

    def __init__(self, cluster: Any, listener: AsyncListener) -> None:
        self._cluster = cluster
        self._listener = listener
        self._shards = Shards(cluster.get_node_from_key)

    async def subscribe(self, channels: list[bytes]) -> None:
        shards = self._shards
        for node, group in shards.subscribing(channels):
            pubsub = shards.pubsubs.get(node.name)
            if pubsub is None:
                pubsub = shards.pubsubs[node.name] = node_client(self._cluster, node).pubsub()
            await pubsub.ssubscribe(*group)

    async def unsubscribe(self, channels: list[bytes]) -> None:
        groups, emptied = self._shards.unsubscribing(channels)
        for pubsub, group in groups:
            await pubsub.sunsubscribe(*group)
        # The listener's reads on them end first: one pending as its
        # connection closes would connect it again, for nobody to close.
        await self._listener.stop_reading(emptied)
        for pubsub in emptied:
            await async_close_node_pubsub(pubsub)

    def pubsubs(self) -> list[Any]:
        return list(self._shards.pubsubs.values())

    def check(self, message: dict[str, Any]) -> None:
        self._shards.check(message)  # a slot that moved away: raises, to start over

    async def aclose(self) -> None:
        for pubsub in self._shards.pubsubs.values():
            await async_close_node_pubsub(pubsub)


class _Subscribers:
    """The subscriber of each client."""

    def __init__(self) -> None:
        self._lock = AsyncSectionLock()
        self._of: weakref.WeakKeyDictionary[Any, AsyncSubscriber] = weakref.WeakKeyDictionary()

    def of(self, client: Any) -> AsyncSubscriber:
        with self._lock:
            found = self._of.get(client)
            if found is None:
                found = self._of[client] = AsyncSubscriber(client)
            return found

    def _forked(self) -> None:
        """In a child process just forked: the lock may have been held by a
        thread that did not come along."""
        self._lock = AsyncSectionLock()
        for subscriber in list(self._of.values()):
            subscriber._forked()


_subscribers = _Subscribers()
async_forks_with(_subscribers)


def async_subscriber_for(client: Any) -> AsyncSubscriber:
    """The subscriber for ``client`` (one per client, shared by every
    instance on it; a ``redis.asyncio`` client belongs to one event loop)."""
    return _subscribers.of(client)
