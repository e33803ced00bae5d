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
import select
import socket
import threading
import time
import weakref
from typing import Any

import redis.cluster
import redis.exceptions

from ._channels import Channels, Shards, WatchBase
from ._events import logger
from ._nodes import node_client
from ._operations import ask_sharded

__all__ = ["Subscriber", "Watch", "subscriber_for"]

#: Seconds without waiters after which the listener closes its connection.
IDLE_SECONDS = 10.0
_MAX_BACKOFF = 1.0


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

    # --- what waiters call ---------------------------------------------------

    def watch(self, channel: bytes) -> Watch:
        """Start watching ``channel``; stop with :meth:`unwatch`."""
        watch = Watch(channel)
        with self._lock:
            self._channels.add(watch)
            start = self._thread is None and not self._closed
            if start:
                self._wake_r, self._wake_w = socket.socketpair()
                self._thread = threading.Thread(target=self._run, name="stampede-subscriber", daemon=True)
        if start:
            assert self._thread is not None
            self._thread.start()
        else:
            self._poke()
        return watch

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
                    return
                try:
                    self._serve(client)
                    return  # idle or closed
                except Exception as exc:  # any failure: the connection is gone
                    logger.info("wake-up connection lost, reconnecting: %s", exc)
                finally:
                    del client
                with self._lock:
                    self._channels.lost()
                    if self._closed or not len(self._channels):
                        return
                time.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)
        finally:
            with self._lock:
                self._thread = None
                reader, writer, self._wake_r, self._wake_w = self._wake_r, self._wake_w, None, None
                if len(self._channels) and not self._closed:
                    # A waiter came in as we stopped: start again for it.
                    self._wake_r, self._wake_w = socket.socketpair()
                    self._thread = threading.Thread(target=self._run, name="stampede-subscriber", daemon=True)
                    self._thread.start()
            for sock in (reader, writer):
                if sock is not None:
                    sock.close()

    def _serve(self, client: Any) -> None:
        link = self._link(client)
        try:
            with self._lock:
                channels = self._channels.resubscribed()
            link.subscribe(channels if link.anchored else channels[1:])
            idle_since: float | None = None
            while True:
                with self._lock:
                    if self._closed:
                        return
                    subscribe, unsubscribe = self._channels.take_pending()
                    watched = len(self._channels)
                link.unsubscribe(unsubscribe)
                link.subscribe(subscribe)
                now = time.monotonic()
                if watched:
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= IDLE_SECONDS:
                    with self._lock:
                        if not len(self._channels) and not self._channels.pending:
                            return
                pubsubs = link.pubsubs()
                self._sleep(*pubsubs)
                # Everything readable now, parsed or still in the socket.
                for pubsub in pubsubs:
                    while (message := link.read(pubsub)) is not None:
                        with self._lock:
                            self._channels.dispatch(message)
        finally:
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

    def _sleep(self, *pubsubs: Any) -> None:
        """Until a connection has data, a waiter pokes, or a second passes."""
        reader = self._wake_r
        socks = [getattr(pubsub.connection, "_sock", None) for pubsub in pubsubs]
        if reader is None or None in socks:
            time.sleep(0.01)  # no socket to select on: poll
            return
        readable, _, _ = select.select([*socks, reader], [], [], 1.0)
        if reader in readable:
            with contextlib.suppress(OSError):
                reader.recv(4096)


class _Classic:
    """One pub/sub connection, classic channels (``SUBSCRIBE``)."""

    anchored = True  # see ANCHOR_PREFIX

    def __init__(self, client: Any) -> None:
        self._pubsub = client.pubsub()

    def subscribe(self, channels: list[bytes]) -> None:
        if channels:
            self._pubsub.subscribe(*channels)

    def unsubscribe(self, channels: list[bytes]) -> None:
        if channels:
            self._pubsub.unsubscribe(*channels)

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


def subscriber_for(client: Any) -> Subscriber:
    """The process's subscriber for ``client`` (one per client, shared by
    every :class:`~stampede.Stampede` on it)."""
    with _lock:
        found = _subscribers.get(client)
        if found is None or found._closed:
            found = _subscribers[client] = Subscriber(client)
        return found
