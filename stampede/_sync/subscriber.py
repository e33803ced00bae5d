"""One pub/sub connection per process and Redis client, for every blocking waiter.

Waiting for someone else's rebuild must not cost a connection per waiter:
redis-py's pool holds at most 100 and raises when empty, and a stampede is
hundreds of callers. A listener thread owns the one pub/sub connection and
all its I/O (redis-py's ``PubSub`` is not safe to read and write from two
threads); waiters register a :class:`Watch` and sleep on its event, which
the listener sets when a message for its channel arrives, when the
subscription is confirmed, and when the connection is lost or restored. A
lost connection therefore never loses a wake-up: every waiter looks at Redis
again and the listener subscribes anew.

The listener stops when nobody has waited for a while, and starts again on
the next wait.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
import weakref
from typing import Any

import redis.cluster
import redis.exceptions

from .._core.channels import Channels, Shards, WatchBase
from .._core.events import logger
from .._core.near import HEARTBEAT_SECONDS, Heartbeat, NearStore, Tracked
from .._redis.nodes import node_client
from .server import ask_sharded

__all__ = ["Subscriber", "Watch", "subscriber_for"]

#: Seconds without waiters after which the listener closes its connection.
IDLE_SECONDS = 10.0
_MAX_BACKOFF = 1.0
#: Where Redis publishes invalidations redirected to a RESP2 connection.
INVALIDATIONS = b"__redis__:invalidate"


class Watch(WatchBase[threading.Event]):
    """A thread's watch on one channel."""

    __slots__ = ()

    def __init__(self, channel: bytes) -> None:
        super().__init__(channel, threading.Event())

    def wait(self, timeout: float) -> bool:
        return self.event.wait(timeout)


class Subscriber:
    """The pub/sub listener of one blocking redis-py client."""

    def __init__(self, client: Any) -> None:
        self._client_ref = weakref.ref(client)
        self._lock = threading.Lock()
        self._channels: Channels[Watch] = Channels()
        self._thread: threading.Thread | None = None
        self._closed = False
        # The listener sleeps in select() on its connection and on this
        # socket pair, so a new waiter's SUBSCRIBE goes out at once.
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        # Near caches kept coherent through this connection (CLIENT TRACKING).
        self._tracked = Tracked()
        self._retrack = False  # a store was added: the link starts over with its prefix
        # Held by whoever reads the connection: the listener, or a near hit
        # that drains pending invalidations itself (see quiet()).
        self._io = threading.Lock()

    # --- what waiters call ---------------------------------------------------

    def watch(self, channel: bytes) -> Watch:
        """Start watching ``channel``; stop with :meth:`unwatch`."""
        watch = Watch(channel)
        with self._lock:
            self._channels.add(watch)
            started = self._start_locked()
        if not started:
            self._poke()
        return watch

    def track(self, store: NearStore) -> None:
        """Keep ``store`` coherent: invalidations of its prefix drop its copies.
        It is live (served from) once tracking is on and confirmed."""
        with self._lock:
            self._tracked.stores.append(store)
            self._retrack = True
            started = self._start_locked()
        if not started:
            self._poke()

    def untrack(self, store: NearStore) -> None:
        with self._lock:
            if store in self._tracked.stores:
                self._tracked.stores.remove(store)
        store.flush(live=False)

    def quiet(self) -> bool:
        """Whether no invalidation waits unread on the connection, so a near copy
        may be served: what every near hit asks first. Pending data is drained
        here, by the caller, rather than left for the listener thread, which
        the GIL may not schedule for milliseconds. ``False``: go to Redis."""
        link = self._tracked.link
        if link is None or not self._tracked.heartbeat.quiet(time.monotonic()):
            return False
        if not link.pending(self._io):
            return True
        if not self._io.acquire(timeout=0.05):
            return False
        try:
            if self._tracked.link is not link:
                return False
            self._drain(link)
            return not link.pending(None)
        except Exception:
            return False  # the listener finds out and starts over
        finally:
            self._io.release()

    def settled(self) -> bool:
        """What :meth:`quiet` said: it drains pending data itself, in the caller."""
        return False

    def revive(self) -> None:
        """Start the listener if near caches are tracked and it is not running
        (after a fork: it did not come along). Asked by reads while a near
        cache is not live."""
        if self._thread is None and self._tracked.stores and not self._closed:
            with self._lock:
                self._start_locked()

    def _drain(self, link: _Classic | _Sharded) -> None:
        """Dispatch everything readable now, parsed or still in the socket
        (the caller holds the io lock)."""
        tracking = isinstance(link, _Classic) and link.tracking
        for pubsub in link.pubsubs():
            while True:
                message = link.read(pubsub)
                if message is None:
                    # A pushed invalidation reads as None too (RESP3): go on
                    # while anything is left, parsed or in the socket.
                    if tracking and link.pending(None):  # type: ignore[union-attr]
                        if not link.same_socket():  # type: ignore[union-attr]
                            # The pool was disconnected under it (the client
                            # closed, a failover) and redis-py reconnected
                            # without tracking: pending for good. Start over.
                            raise redis.exceptions.ConnectionError("the tracking connection was replaced")
                        continue
                    break
                if message.get("type") == "pong" and self._tracked.heartbeat.answered(message.get("data")):
                    continue
                if message.get("channel") == INVALIDATIONS:
                    if message.get("type") == "message":
                        self._tracked.invalidated(message["data"])
                    elif message.get("type") == "subscribe":
                        self._set_live(link)
                    continue
                with self._lock:
                    self._channels.dispatch(message)

    def _set_live(self, link: _Classic | _Sharded) -> None:
        if isinstance(link, _Classic):
            self._tracked.live(link, time.monotonic())

    def _set_dead(self) -> None:
        self._tracked.dead()

    def unwatch(self, watch: Watch) -> None:
        with self._lock:
            self._channels.remove(watch)
        self._poke()

    def close(self) -> None:
        """Stop the listener (waiters still registered fall back to polling)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._poke()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def _forked(self) -> None:
        """In a child process just forked: the listener thread did not come
        along, and the connection and wake-up sockets are the parent's (left
        to it: not read, written or shut down here). Starts anew on demand."""
        self._lock = threading.Lock()
        self._io = threading.Lock()
        self._channels = Channels()
        self._thread = None
        self._wake_r = self._wake_w = None
        self._tracked.link = None
        self._tracked.heartbeat = Heartbeat()
        self._retrack = bool(self._tracked.stores)
        for store in self._tracked.stores:
            store.forked()

    def _start_locked(self) -> bool:
        """Start the listener unless it runs or the subscriber is closed (the
        caller holds the lock). Returns whether it started it."""
        if self._thread is not None or self._closed:
            return False
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name="stampede-subscriber", daemon=True)
        self._thread.start()
        return True

    def _poke(self) -> None:
        writer = self._wake_w
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.send(b"\0")

    # --- the listener thread ---------------------------------------------------

    def _run(self) -> None:
        backoff = 0.05
        try:
            while True:
                client = self._client_ref()
                if client is None:
                    # The client is gone, and with it any use for this
                    # subscriber: it must not be started again (a thread a turn).
                    with self._lock:
                        self._closed = True
                    return
                try:
                    if self._serve(client):
                        continue  # a near cache was added: start over with its prefix
                    return  # idle or closed
                except Exception as exc:  # any failure: the connection is gone
                    logger.info("wake-up connection lost, reconnecting: %s", exc)
                finally:
                    self._set_dead()
                    del client
                with self._lock:
                    self._channels.lost()
                    if self._closed or not (len(self._channels) or self._tracked.stores):
                        return
                time.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
        finally:
            with self._lock:
                self._thread = None
                reader, writer, self._wake_r, self._wake_w = self._wake_r, self._wake_w, None, None
                if len(self._channels) or self._tracked.stores:
                    self._start_locked()  # a waiter came in as we stopped: start again for it
            for sock in (reader, writer):
                if sock is not None:
                    sock.close()

    def _serve(self, client: Any) -> bool:
        """Serve one connection until idle or closed (``False``), or until a
        near cache is added (``True``: start over, tracking its prefix too)."""
        link = self._link(client)
        try:
            with self._lock:
                channels = self._channels.resubscribed()
                # Once each: Redis refuses a prefix given twice (two instances, one namespace).
                prefixes = sorted({store.prefix for store in self._tracked.stores})
                self._retrack = False
            now = time.monotonic()
            with self._io:
                if prefixes and isinstance(link, _Classic) and self._tracked.may_track(now):
                    try:
                        redirected = link.track(prefixes, self._tracked.invalidated)
                    except redis.exceptions.ResponseError as exc:
                        self._tracked.refused(exc, now)
                    else:
                        self._tracked.accepted()
                        if redirected:
                            channels.append(INVALIDATIONS)  # RESP2: live once subscribed
                        else:
                            self._set_live(link)  # RESP3: pushed on this connection from now on
                link.subscribe(channels if link.anchored else channels[1:])
            idle_since: float | None = None
            while True:
                with self._lock:
                    if self._closed:
                        return False
                    if self._retrack or self._tracked.retry_due(time.monotonic()):
                        return True  # start over, tracking the new prefix or asking again
                    subscribe, unsubscribe = self._channels.take_pending()
                    watched = len(self._channels) or len(self._tracked.stores)
                with self._io:
                    link.unsubscribe(unsubscribe)
                    link.subscribe(subscribe)
                now = time.monotonic()
                if watched:
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= IDLE_SECONDS:
                    with self._lock:
                        idle = not (len(self._channels) or self._channels.pending or self._tracked.stores)
                        if idle:
                            return False
                tracking = isinstance(link, _Classic) and link.tracking
                self._sleep(*link.pubsubs(), timeout=HEARTBEAT_SECONDS if tracking else 1.0)
                with self._io:
                    self._drain(link)
                if tracking:
                    assert isinstance(link, _Classic)
                    if not link.same_socket():
                        # redis-py reconnected on its own, without tracking: what was
                        # written meanwhile was never told. Start over.
                        raise redis.exceptions.ConnectionError("the tracking connection was replaced")
                    try:
                        payload = self._tracked.heartbeat.due(time.monotonic())
                    except TimeoutError as exc:
                        raise redis.exceptions.TimeoutError(str(exc)) from None
                    if payload is not None:
                        with self._io:
                            link.ping(payload)
        finally:
            self._set_dead()
            link.close()

    @staticmethod
    def _link(client: Any) -> _Classic | _Sharded:
        if isinstance(client, redis.cluster.RedisCluster):
            sharded = ask_sharded(client)
            if sharded is None:
                raise redis.exceptions.ConnectionError("cannot tell whether the cluster has sharded pub/sub")
            if sharded:
                return _Sharded(client)
        return _Classic(client)

    def _sleep(self, *pubsubs: Any, timeout: float) -> None:
        """Until a connection has data, a waiter pokes, or ``timeout`` passes."""
        reader = self._wake_r
        socks = [getattr(pubsub.connection, "_sock", None) for pubsub in pubsubs]
        if reader is None or None in socks:
            time.sleep(0.01)  # no socket to select on: poll
            return
        readable, _, _ = select.select([*socks, reader], [], [], timeout)
        if reader in readable:
            with contextlib.suppress(OSError):
                reader.recv(4096)


class _Classic:
    """One pub/sub connection, classic channels (``SUBSCRIBE``)."""

    anchored = True  # see ANCHOR_PREFIX

    def __init__(self, client: Any) -> None:
        self._pubsub = client.pubsub()
        self._sock: socket.socket | None = None  # the tracking connection's, once tracking
        # A poll object per thread: one may not be polled by two at once.
        self._polls = threading.local()

    def track(self, prefixes: list[bytes], invalidated: Any) -> bool:
        """``CLIENT TRACKING`` in broadcast mode on ``prefixes``, sent before
        anything is subscribed (RESP2 refuses it after). Returns whether the
        invalidations come on :data:`INVALIDATIONS` (RESP2, redirected to this
        very connection), rather than pushed to ``invalidated`` (RESP3)."""
        pubsub = self._pubsub
        pubsub.execute_command("CLIENT", "ID")  # connects
        own_id = pubsub.parse_response(block=True)
        connection = pubsub.connection
        parser = connection._parser
        watched = [part for prefix in prefixes for part in (b"PREFIX", prefix)]
        resp3 = str(getattr(connection, "protocol", 2)) == "3"
        if resp3 and hasattr(parser, "set_invalidation_push_handler"):
            parser.set_invalidation_push_handler(lambda push: invalidated(push[1]))
            pubsub.execute_command("CLIENT", "TRACKING", "ON", "BCAST", *watched)
            redirected = False
        else:
            pubsub.execute_command("CLIENT", "TRACKING", "ON", "REDIRECT", own_id, "BCAST", *watched)
            redirected = True
        reply = pubsub.parse_response(block=True)
        if reply not in (b"OK", "OK"):
            raise redis.exceptions.ResponseError(f"CLIENT TRACKING refused: {reply!r}")
        self._sock = connection._sock
        return redirected

    @property
    def tracking(self) -> bool:
        return self._sock is not None

    def same_socket(self) -> bool:
        """Whether the connection is still the one tracking was turned on for."""
        connection = self._pubsub.connection
        return connection is not None and connection._sock is self._sock

    def pending(self, io: threading.Lock | None) -> bool:
        """Whether anything may wait unread on the connection: bytes in the
        socket, a reader at work (``io`` held), or bytes redis-py has read
        but not parsed."""
        connection = self._pubsub.connection
        sock = self._sock
        if sock is None or connection is None or connection._sock is not sock:
            return True  # not tracking, or reconnected behind our back (without tracking)
        poll = getattr(self._polls, "poll", None)
        if poll is None:
            poll = self._polls.poll = select.poll()
            poll.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        if poll.poll(0):
            return True
        if io is not None and io.locked():
            return True
        parser = connection._parser
        buffer = getattr(parser, "_buffer", None)
        if buffer is not None and hasattr(buffer, "unread_bytes") and buffer.unread_bytes():
            return True
        reader = getattr(parser, "_reader", None)
        return reader is not None and hasattr(reader, "has_data") and bool(reader.has_data())

    def subscribe(self, channels: list[bytes]) -> None:
        if channels:
            self._pubsub.subscribe(*channels)

    def unsubscribe(self, channels: list[bytes]) -> None:
        if channels:
            self._pubsub.unsubscribe(*channels)

    def ping(self, payload: bytes) -> None:
        """Send a PING; its answer comes as a ``pong`` message."""
        self._pubsub.ping(payload)

    def pubsubs(self) -> list[Any]:
        return [self._pubsub]

    def read(self, pubsub: Any) -> dict[str, Any] | None:
        message: dict[str, Any] | None = pubsub.get_message(timeout=0)
        return message

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pubsub.close()


class _Sharded:
    """A cluster with sharded pub/sub: each channel subscribed (``SSUBSCRIBE``)
    on the node that owns its slot, one connection per node with waiters."""

    anchored = False  # see Shards

    def __init__(self, cluster: Any) -> None:
        self._cluster = cluster
        self._shards = Shards(cluster.get_node_from_key)

    def subscribe(self, channels: list[bytes]) -> None:
        shards = self._shards
        for node, group in shards.subscribing(channels):
            pubsub = shards.pubsubs.get(node.name)
            if pubsub is None:
                pubsub = shards.pubsubs[node.name] = node_client(self._cluster, node).pubsub()
            pubsub.ssubscribe(*group)

    def unsubscribe(self, channels: list[bytes]) -> None:
        groups, emptied = self._shards.unsubscribing(channels)
        for pubsub, group in groups:
            pubsub.sunsubscribe(*group)
        for pubsub in emptied:
            _close(pubsub)

    def pubsubs(self) -> list[Any]:
        return list(self._shards.pubsubs.values())

    def read(self, pubsub: Any) -> dict[str, Any] | None:
        message: dict[str, Any] | None = pubsub.get_message(timeout=0)
        self._shards.check(message)  # a slot that moved away: raises, to start over
        return message

    def close(self) -> None:
        for pubsub in self._shards.pubsubs.values():
            _close(pubsub)


def _close(pubsub: Any) -> None:
    """Close a pub/sub connection and the pool of the node client it came from."""
    with contextlib.suppress(Exception):
        pubsub.close()
        pubsub.connection_pool.disconnect()


_lock = threading.Lock()
_subscribers: weakref.WeakKeyDictionary[Any, Subscriber] = weakref.WeakKeyDictionary()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    for subscriber in list(_subscribers.values()):
        subscriber._forked()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_after_fork_in_child)


def subscriber_for(client: Any) -> Subscriber:
    """The process's subscriber for ``client`` (one per client, shared by
    every :class:`~stampede.Stampede` on it)."""
    with _lock:
        found = _subscribers.get(client)
        if found is None or found._closed:
            found = _subscribers[client] = Subscriber(client)
        return found
