"""The subscriber, by flavour: where it listens (a task, or a thread), its
tracking connection's check for unread data, closing its connections."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Protocol

import redis.cluster
import redis.exceptions

# --- the subscriber: its listener, its tracking connection, closing its connections ---

#: A message from a pub/sub connection, as redis-py makes it (``None``: nothing
#: for the subscriber, such as a pushed invalidation, handled by the parser).
Message = dict[str, Any] | None

#: Seconds a connection is given to close cleanly before its socket is closed.
_CLOSE_SECONDS = 1.0
#: Turns of the event loop a near read gives the listener to read what is
#: pending: the socket is read on one, the listener runs on the next.
_SETTLE_TURNS = 4


class _Tracked(Protocol):
    link: Any


class AsyncListener:
    """Where an asyncio subscriber listens: a task on the event loop.

    It keeps one read pending on each pub/sub connection at all times (never
    cancelled while the connection serves, so no reply is ever cut in half)
    and acts on each message in the step that reads it, so nothing read
    waits unseen by a near hit. Commands are sent beside those reads, which
    redis-py's asyncio ``PubSub`` allows; nobody else reads the connections,
    so :attr:`io` holds nothing.
    """

    def __init__(self, act: Callable[[Message], None]) -> None:
        self._act = act
        self._task: asyncio.Task[None] | None = None
        self._poked = asyncio.Event()
        self._poke_wait: asyncio.Future[Any] | None = None
        self._reads: dict[Any, asyncio.Future[None]] = {}  # pub/sub connection -> its pending read
        self.io: contextlib.nullcontext[None] = contextlib.nullcontext()

    @property
    def running(self) -> asyncio.Task[None] | None:
        """The listener's task, if it runs."""
        task = self._task
        return task if task is not None and not task.done() else None

    def start(self, run: Callable[[], Coroutine[Any, Any, None]]) -> bool:
        """Run ``run`` as the listener; ``False`` if there is no running event
        loop to run it on (made off the loop: the first read starts it)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._task = loop.create_task(run(), name="stampede-subscriber")
        return True

    def ended(self) -> None:
        """The listener is on its way out: it runs no more (a new one may start)."""
        self._task = None

    def poke(self) -> None:
        """Wake the listener from its wait, from any thread."""
        task = self.running
        if task is None:
            return
        loop = task.get_loop()
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._poked.set()
        else:
            with contextlib.suppress(RuntimeError):  # its loop closed
                loop.call_soon_threadsafe(self._poked.set)

    async def join(self, task: asyncio.Task[None] | None, connections: Callable[[], list[Any]]) -> None:
        """Wait for ``task``, asked to stop, to end. Its connections close
        within :data:`_CLOSE_SECONDS` each; a task that does not end is
        cancelled, and if that does not end it either, the sockets of
        ``connections`` are closed (not left open when the loop closes)."""
        if task is None:
            return
        await asyncio.wait({task}, timeout=4 * _CLOSE_SECONDS)
        if not task.done():
            open_now = connections()
            task.cancel()
            await asyncio.wait({task}, timeout=_CLOSE_SECONDS)
            if not task.done():
                close_sockets(open_now)

    @contextlib.asynccontextmanager
    async def listening(self, link: Any) -> AsyncIterator[None]:
        """While the listener serves ``link``: on the way out its pending
        reads are dropped and ``link`` is closed."""
        abandoned = False
        try:
            yield
        except GeneratorExit:
            # The task was destroyed with its event loop: nothing can be
            # awaited any more, so the sockets are closed as they are.
            abandoned = True
            raise
        finally:
            if abandoned:
                self._drop_reads()
                close_sockets([pubsub.connection for pubsub in link.pubsubs()])
            else:
                try:
                    await self.stop_reading(list(self._reads))
                finally:
                    self._drop_reads()
                    await link.aclose()

    async def stop_reading(self, pubsubs: list[Any]) -> None:
        """End the pending reads of ``pubsubs``, which are about to be closed,
        and wait (:data:`_CLOSE_SECONDS` at most) until they have. A read left
        pending on a closed connection fails, and redis-py's retry connects it
        again: a connection its pub/sub no longer holds, which nobody closes."""
        ending = [self._reads.pop(pubsub) for pubsub in pubsubs if pubsub in self._reads]
        for read in ending:
            _drop(read)
        if any(not read.done() for read in ending):
            await asyncio.wait(ending, timeout=_CLOSE_SECONDS)
        for read in ending:
            _drop(read)  # what a read raised as it ended is not reported as never retrieved

    async def wait(self, pubsubs: list[Any], tracking: Any, timeout: float) -> None:
        """Until a message was read (and acted on), a waiter pokes, or
        ``timeout`` passes. Raises what a read raised. (``tracking`` is for
        the blocking twin's drain: a pending read here needs no such care.)"""
        reads = self._reads
        for pubsub in pubsubs:
            if pubsub not in reads:
                reads[pubsub] = asyncio.ensure_future(self._read(pubsub))
        if self._poke_wait is None:
            self._poked.clear()
            self._poke_wait = asyncio.ensure_future(self._poked.wait())
        done, _ = await asyncio.wait(
            {*reads.values(), self._poke_wait}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if self._poke_wait in done:
            self._poke_wait = None
        for pubsub, read in list(reads.items()):
            if read in done:
                del reads[pubsub]
                read.result()  # raises what the read raised

    async def _read(self, pubsub: Any) -> None:
        """Read one message and act on it in the same step, so that nothing
        read is left waiting for the listener's next turn unseen by a near hit."""
        self._act(await pubsub.get_message(timeout=None))

    def _drop_reads(self) -> None:
        for pending in (*self._reads.values(), self._poke_wait):
            if pending is not None:
                _drop(pending)
        self._reads = {}
        self._poke_wait = None

    def drained(self, tracking: Any, tracked: _Tracked) -> bool:
        """A near hit's second chance when something is unread: none here.
        Code that does not wait cannot read an asyncio stream; the hit goes
        to Redis (or to :meth:`settled`), which lets the listener read it."""
        return False

    async def settled(self, quiet: Callable[[], bool]) -> bool:
        """``quiet()``, after letting the listener read what is pending for a
        few turns of the event loop (cheaper than a round trip to Redis)."""
        for _ in range(_SETTLE_TURNS):
            if quiet():
                return True
            await asyncio.sleep(0)
        return quiet()


def _drop(pending: asyncio.Future[Any]) -> None:
    """Cancel ``pending``, or take what it raised if it is done (so that it
    is not reported as never retrieved)."""
    if not pending.done():
        with contextlib.suppress(RuntimeError):  # a closed loop
            pending.cancel()
    elif not pending.cancelled():
        pending.exception()


class Listener:
    """Where a blocking subscriber listens: a daemon thread.

    It sleeps in ``select()`` on its pub/sub connections and on a wake-up
    socket pair (so a new waiter's SUBSCRIBE goes out at once), then reads
    whatever is readable. redis-py's ``PubSub`` is not safe to use from two
    threads at once, and near hits read pending invalidations themselves
    (:meth:`drained`), so whoever uses the connections holds :attr:`io`.
    """

    def __init__(self, act: Callable[[Message], None]) -> None:
        self._act = act
        self._thread: threading.Thread | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        #: Held by whoever reads or writes the connections: the listener, or
        #: a near hit that reads pending invalidations itself.
        self.io = threading.Lock()

    @property
    def running(self) -> threading.Thread | None:
        """The listener's thread, if it runs."""
        return self._thread

    def start(self, run: Callable[[], None]) -> bool:
        """Run ``run`` as the listener, in a thread of its own."""
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=run, name="stampede-subscriber", daemon=True)
        self._thread.start()
        return True

    def ended(self) -> None:
        """The listener is on its way out: it runs no more (a new one may start)."""
        self._thread = None
        for sock in (self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._wake_r = self._wake_w = None

    def poke(self) -> None:
        """Wake the listener from its wait, from any thread."""
        writer = self._wake_w
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.send(b"\0")

    def join(self, thread: threading.Thread | None, connections: Callable[[], list[Any]]) -> None:
        """Wait a while (5 s) for ``thread``, asked to stop, to end, unless it
        is the caller's own."""
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def stop_reading(self, pubsubs: list[Any]) -> None:
        """Nothing to end: the connections are read only while :attr:`io` is
        held, which whoever closes them holds."""

    @contextlib.contextmanager
    def listening(self, link: Any) -> Iterator[None]:
        """While the listener serves ``link``: closed on the way out, under
        :attr:`io` (a near hit reading it as it closed would have redis-py
        connect it again)."""
        try:
            yield
        finally:
            with self.io:
                link.close()

    def wait(self, pubsubs: list[Any], tracking: TrackingConnection | None, timeout: float) -> None:
        """Until a connection has data, a waiter pokes, or ``timeout`` passes;
        then act on everything readable."""
        reader = self._wake_r
        socks = [getattr(pubsub.connection, "_sock", None) for pubsub in pubsubs]
        if reader is None or None in socks:
            time.sleep(0.01)  # no socket to select on: poll
        else:
            readable, _, _ = select.select([*socks, reader], [], [], timeout)
            if reader in readable:
                with contextlib.suppress(OSError):
                    reader.recv(4096)
        with self.io:
            self._drain(pubsubs, tracking)

    def _drain(self, pubsubs: list[Any], tracking: TrackingConnection | None) -> None:
        """Act on everything readable now, parsed or still in the socket (the
        caller holds :attr:`io`)."""
        for pubsub in pubsubs:
            while True:
                message = pubsub.get_message(timeout=0)
                if message is None:
                    # A pushed invalidation reads as None too (RESP3): go on
                    # while anything is left, parsed or in the socket.
                    if tracking is not None and tracking.pending(reading=True):
                        if not tracking.current():
                            # The pool was disconnected under it (the client
                            # closed, a failover) and redis-py reconnected
                            # without tracking: pending for good. Start over.
                            raise redis.exceptions.ConnectionError("the tracking connection was replaced")
                        continue
                    break
                self._act(message)

    def drained(self, tracking: TrackingConnection, tracked: _Tracked) -> bool:
        """A near hit's second chance when something is unread: it reads it
        here rather than leave it to the listener thread, which the GIL may
        not schedule for milliseconds. Whether nothing is left unread."""
        if not self.io.acquire(timeout=0.05):
            return False
        try:
            if tracked.link is not tracking:
                return False
            self._drain([tracking.pubsub], tracking)
            return not tracking.pending(reading=True)
        except Exception:
            return False  # the listener finds out and starts over
        finally:
            self.io.release()

    def settled(self, quiet: Callable[[], bool]) -> bool:
        """What ``quiet()`` said: it read what was pending itself, in the caller."""
        return False


class AsyncTrackingConnection:
    """The pub/sub connection ``CLIENT TRACKING`` was turned on for, as near
    hits see it: whether anything waits unread on it (in the socket, in the
    stream's buffer, or parsed in part)."""

    __slots__ = ("_poll", "_stream", "pubsub")

    def __init__(self, pubsub: Any, io: object) -> None:
        """``io``: the listener's, which nobody but the listener holds here."""
        connection = pubsub.connection
        self.pubsub = pubsub
        self._stream = connection._reader
        sock = connection._writer.transport.get_extra_info("socket")
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)

    def current(self) -> bool:
        """Whether the connection is still the one tracking was turned on for."""
        connection = self.pubsub.connection
        return connection is not None and connection._reader is self._stream

    def pending(self) -> bool:
        """Whether anything may wait unread on the connection: what every near
        hit asks, so kept cheap."""
        stream = self._stream
        connection = self.pubsub.connection
        if connection is None or connection._reader is not stream:
            return True  # closed, or reconnected behind our back (without tracking)
        if stream._buffer or stream.at_eof():
            return True
        parser = connection._parser
        if getattr(parser, "_buffer", None) or getattr(parser, "_chunks", None):
            return True
        reader = getattr(parser, "_reader", None)
        if reader is not None and hasattr(reader, "has_data") and reader.has_data():
            return True
        return bool(self._poll.poll(0))


class TrackingConnection:
    """The pub/sub connection ``CLIENT TRACKING`` was turned on for, as near
    hits see it: whether anything waits unread on it (in the socket, read by
    a thread at work on it, or read by redis-py but not parsed)."""

    __slots__ = ("_io", "_polls", "_sock", "pubsub")

    def __init__(self, pubsub: Any, io: threading.Lock) -> None:
        """``io``: the listener's, held by whoever reads the connection."""
        self.pubsub = pubsub
        self._sock = pubsub.connection._sock
        self._io = io
        # A poll object per thread: one may not be polled by two at once.
        self._polls = threading.local()

    def current(self) -> bool:
        """Whether the connection is still the one tracking was turned on for."""
        connection = self.pubsub.connection
        return connection is not None and connection._sock is self._sock

    def pending(self, reading: bool = False) -> bool:
        """Whether anything may wait unread on the connection: what every near
        hit asks, so kept cheap. ``reading``: the caller holds ``io`` (a
        reader at work is then no sign)."""
        connection = self.pubsub.connection
        sock = self._sock
        if connection is None or connection._sock is not sock:
            return True  # closed, or reconnected behind our back (without tracking)
        poll = getattr(self._polls, "poll", None)
        if poll is None:
            poll = self._polls.poll = select.poll()
            poll.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        if poll.poll(0):
            return True
        if not reading and self._io.locked():
            return True
        parser = connection._parser
        buffer = getattr(parser, "_buffer", None)
        if buffer is not None and hasattr(buffer, "unread_bytes") and buffer.unread_bytes():
            return True
        reader = getattr(parser, "_reader", None)
        return reader is not None and hasattr(reader, "has_data") and bool(reader.has_data())


async def async_close_pubsub(pubsub: Any) -> None:
    """Close a pub/sub connection, within :data:`_CLOSE_SECONDS`: closing
    waits for unsent bytes, which a stalled peer never takes, so after that
    its socket is closed as it is."""
    connection = pubsub.connection
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(asyncio.shield(pubsub.aclose()), _CLOSE_SECONDS)
    if connection is not None and connection._writer is not None:
        close_sockets([connection])


def close_pubsub(pubsub: Any) -> None:
    with contextlib.suppress(Exception):
        pubsub.close()


async def async_close_node_pubsub(pubsub: Any) -> None:
    """Close a pub/sub connection and the pool of the node client it came
    from, unbounded and shielded: forcing the sockets shut would race a close
    still running (in a cluster failover, callers saw it fail)."""
    with contextlib.suppress(BaseException):
        await asyncio.shield(pubsub.aclose())
        await pubsub.connection_pool.disconnect()


def close_node_pubsub(pubsub: Any) -> None:
    with contextlib.suppress(Exception):
        pubsub.close()
        pubsub.connection_pool.disconnect()


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
