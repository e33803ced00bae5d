"""Who waits on which wake-up channel: the I/O-free half of a subscriber.

A process holds one pub/sub connection per Redis, shared by every waiter of
every key (:mod:`stampede._sync.subscriber` for threads, :mod:`stampede._async.subscriber`
for asyncio). This module keeps the bookkeeping both share: the watches per
channel, which channels the server has confirmed, and what each message
means to the watches it reaches. Its callers do the I/O and the locking.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from .ops import RELEASED

__all__ = ["ANCHOR_PREFIX", "Channels", "Shards", "SlotMoved", "WatchBase"]

#: A channel nobody publishes to, subscribed for the connection's whole life:
#: a connection subscribed to nothing would read a health check's reply as
#: a message (redis-py sends one before a command on an unsubscribed one).
ANCHOR_PREFIX = b"stampede:anchor:"


class _Wakeable(Protocol):
    def set(self) -> None: ...

    def clear(self) -> None: ...


E = TypeVar("E", bound=_Wakeable)


class WatchBase(Generic[E]):
    """One waiter's interest in one channel.

    ``event`` is set whenever the waiter should look at Redis again: the
    subscription was confirmed, a message arrived, or the connection was
    lost or restored. ``released`` records a release announcement (a lease
    given up without a value) since the watch began.
    """

    __slots__ = ("channel", "event", "live", "released")

    def __init__(self, channel: bytes, event: E) -> None:
        self.channel = channel
        self.event = event
        self.released = False
        #: The server confirmed the subscription: no message can be missed
        #: from here on (until the connection is lost).
        self.live = False

    def wake(self) -> None:
        self.event.set()


W = TypeVar("W", bound=WatchBase[Any])


class Channels(Generic[W]):
    """The watches of a subscriber by channel, and what messages do to them."""

    def __init__(self) -> None:
        self.anchor = ANCHOR_PREFIX + secrets.token_hex(8).encode()
        self._watches: dict[bytes, set[W]] = {}
        self._live: set[bytes] = set()
        # Subscribe/unsubscribe commands not yet sent, in order.
        self.pending: list[tuple[bool, bytes]] = []

    def __len__(self) -> int:
        return len(self._watches)

    def channels(self) -> list[bytes]:
        return list(self._watches)

    def add(self, watch: W) -> None:
        """Register ``watch``; queue a SUBSCRIBE if its channel is new."""
        watches = self._watches.get(watch.channel)
        if watches is None:
            watches = self._watches[watch.channel] = set()
            self.pending.append((True, watch.channel))
        watches.add(watch)
        if watch.channel in self._live:
            watch.live = True
            watch.wake()

    def remove(self, watch: W) -> None:
        """Forget ``watch``; queue an UNSUBSCRIBE if nobody else watches its channel."""
        watches = self._watches.get(watch.channel)
        if watches is None:
            return
        watches.discard(watch)
        if not watches:
            del self._watches[watch.channel]
            self._live.discard(watch.channel)
            self.pending.append((False, watch.channel))

    def take_pending(self) -> tuple[list[bytes], list[bytes]]:
        """The channels to subscribe to and to unsubscribe from now, net of
        requests that cancel out."""
        wanted: dict[bytes, bool] = {}
        for on, channel in self.pending:
            wanted[channel] = on
        self.pending = []
        to_subscribe = [channel for channel, on in wanted.items() if on and channel in self._watches]
        to_unsubscribe = [
            channel for channel, on in wanted.items() if not on and channel not in self._watches
        ]
        return to_subscribe, to_unsubscribe

    def dispatch(self, message: dict[str, Any] | None) -> None:
        """Apply one message read from the pub/sub connection."""
        if message is None:
            return
        kind = message["type"]
        channel = message["channel"]
        if kind in ("message", "smessage"):
            released = message["data"] == RELEASED
            for watch in self._watches.get(channel, ()):
                if released:
                    watch.released = True
                watch.wake()
        elif kind in ("subscribe", "ssubscribe"):
            watches = self._watches.get(channel)
            if watches is not None:
                self._live.add(channel)
                for watch in watches:
                    watch.live = True
                    watch.wake()
        elif kind in ("unsubscribe", "sunsubscribe"):
            # Still watched: a SUBSCRIBE was sent after this UNSUBSCRIBE and
            # its confirmation follows; until then messages can be missed.
            self._live.discard(channel)
            for watch in self._watches.get(channel, ()):
                watch.live = False

    def lost(self) -> None:
        """The connection is gone: nothing is confirmed any more, and every
        waiter looks at Redis itself (a message may have been missed)."""
        self._live.clear()
        self.pending = []
        for watch in self.all():
            watch.live = False
            watch.wake()

    def resubscribed(self) -> list[bytes]:
        """The channels to subscribe to on a new connection."""
        self.pending = []
        return [self.anchor, *self._watches]

    def all(self) -> Iterator[W]:
        for watches in self._watches.values():
            yield from watches


class SlotMoved(Exception):
    """The server dropped a sharded subscription: its slot moved to another node."""


class Shards:
    """Which node's connection each channel is subscribed on, with sharded
    pub/sub: a channel's messages come only from the node that owns its slot.

    No I/O: the subscribers do it from the plans. A node's connection is
    closed once no channel is left on it, rather than kept subscribed to
    nothing (see :data:`ANCHOR_PREFIX`), so no anchor is needed.
    """

    def __init__(self, locate: Callable[[bytes], Any]) -> None:
        """``locate``: the node that owns a channel's slot (the cluster client's view)."""
        self._locate = locate
        self._node_of: dict[bytes, str] = {}
        #: Each node's pub/sub connection, by node name; the subscriber's to fill.
        self.pubsubs: dict[str, Any] = {}

    def subscribing(self, channels: list[bytes]) -> list[tuple[Any, list[bytes]]]:
        """The channels to subscribe to, grouped by the node to send each group to."""
        groups: dict[str, tuple[Any, list[bytes]]] = {}
        for channel in channels:
            node = self._locate(channel)
            self._node_of[channel] = node.name
            groups.setdefault(node.name, (node, []))[1].append(channel)
        return list(groups.values())

    def unsubscribing(self, channels: list[bytes]) -> tuple[list[tuple[Any, list[bytes]]], list[Any]]:
        """The channels to unsubscribe from, with the connection of each group;
        and the connections left with no channel, to close (taken out of
        :attr:`pubsubs`)."""
        groups: dict[str, list[bytes]] = {}
        for channel in channels:
            name = self._node_of.pop(channel, None)
            if name is not None:
                groups.setdefault(name, []).append(channel)
        still = set(self._node_of.values())
        emptied = [self.pubsubs.pop(name) for name in groups if name not in still and name in self.pubsubs]
        kept = [(self.pubsubs[name], group) for name, group in groups.items() if name in self.pubsubs]
        return kept, emptied

    def check(self, message: dict[str, Any] | None) -> None:
        """Raise :class:`SlotMoved` for an ``sunsubscribe`` nobody asked for:
        the server's, when the channel's slot moved to another node."""
        if message is not None and message["type"] == "sunsubscribe" and message["channel"] in self._node_of:
            raise SlotMoved(f"the slot of {message['channel']!r} moved")
