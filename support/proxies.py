"""TCP proxies in front of a Redis, for faults injected for real, on the wire, rather than by
patching the client.

- :class:`FaultyProxy` can lose replies, freeze, or cut its connections:
  ``lose_replies()``: requests still reach Redis and run, their replies are dropped (a reply
  lost on the way back; the client times out and retries what already ran).
  ``lose_replies_from(marker)``: the same, from the first request that holds ``marker`` on (its
  own reply included). ``freeze()``: nothing moves either way; what was sent waits in the
  kernel's buffers and is delivered late on ``thaw()`` (a stalled link). ``cut()``: every open
  connection is closed at once (a reset).
- :class:`LagProxy` holds every reply back for a while: a slow Redis (a busy server, a saturated
  link, a host in another zone). ``proxy.lag = 0.3`` delivers each reply 300 ms after Redis sent
  it, in order, and ``proxy.lag = 0`` delivers those that come next at once again
  (:meth:`LagProxy.release` delivers those held too). Requests go through at once, and
  :meth:`LagProxy.requests` counts those that held a marker.

``with Proxy(redis_port) as proxy:`` clients connect to ``proxy.url``. One thread moves the
bytes with ``selectors``; new connections are accepted in every state, as a kernel would.
"""

from __future__ import annotations

import collections
import selectors
import socket
import threading
import time
from types import TracebackType

__all__ = ["FaultyProxy", "LagProxy"]

#: The longest the lag proxy's thread sleeps between looks at what is due (seconds).
TICK = 0.005


class _Pair:
    """A client's connection and the proxy's own to Redis, with the replies held back."""

    __slots__ = ("client", "due", "upstream")

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.due: collections.deque[tuple[float, bytes]] = collections.deque()

    def close(self) -> None:
        for sock in (self.client, self.upstream):
            try:
                sock.close()
            except OSError:
                pass


class _Proxy:
    """What both proxies share: the listener, the connections made, and the thread."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self._upstream = (host, upstream_port)
        self._listener = socket.create_server((host, 0))
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._pairs: list[_Pair] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    @property
    def url(self) -> str:
        return f"redis://{self._upstream[0]}:{self.port}/0"

    def _run(self) -> None:
        raise NotImplementedError

    def _connect(self) -> _Pair | None:
        """A client waiting to be accepted, and a connection to Redis for it (``None``: none
        was waiting, or Redis refused, and so is the client)."""
        try:
            client, _ = self._listener.accept()
        except OSError:
            return None
        try:
            upstream = socket.create_connection(self._upstream, timeout=1.0)
        except OSError:
            client.close()  # Redis is down: refuse, as Redis itself would
            return None
        for sock in (client, upstream):
            sock.settimeout(1.0)  # a peer that stops reading cannot stall the proxy for long
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = _Pair(client, upstream)
        self._pairs.append(pair)
        return pair

    def __enter__(self) -> _Proxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(5)
        for pair in self._pairs:
            pair.close()
        self._listener.close()


class FaultyProxy(_Proxy):
    """A faithful proxy until told to lose replies, freeze or cut (see the module's docstring)."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        super().__init__(upstream_port, host)
        self._losing = False
        self._lose_from: bytes | None = None
        self._frozen = False
        self._cut = False
        self._frozen_seen = threading.Event()  # set by the proxy's thread once frozen

    def lose_replies(self, on: bool = True) -> None:
        """Drop (``on``) or deliver again every reply from Redis."""
        self._losing = on

    def lose_replies_from(self, marker: bytes) -> None:
        """Drop every reply from the first request holding ``marker`` on."""
        self._lose_from = marker

    def freeze(self) -> None:
        """Move nothing until :meth:`thaw`; returns once nothing moves."""
        self._frozen_seen.clear()
        self._frozen = True
        if self._thread.is_alive():
            self._frozen_seen.wait(5)

    def thaw(self) -> None:
        self._frozen = False

    def cut(self) -> None:
        """Close every connection open now (new ones are accepted)."""
        self._cut = True

    def heal(self) -> None:
        """Back to a faithful proxy."""
        self._losing = self._frozen = False
        self._lose_from = None

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        watched: dict[socket.socket, tuple[_Pair, socket.socket, bool]] = {}
        while not self._stop.is_set():
            if self._cut:
                self._cut = False
                for sock in list(watched):
                    selector.unregister(sock)
                for pair in self._pairs:
                    pair.close()
                self._pairs.clear()
                watched.clear()
            # Frozen: read nothing, so bytes wait in the kernel (and the
            # senders' buffers fill), as on a stalled link.
            if self._frozen:
                for sock in list(watched):
                    selector.unregister(sock)
                    del watched[sock]
                self._frozen_seen.set()  # bytes forwarded before this were read before the freeze
            if not self._frozen:
                for pair in self._pairs:
                    for sock, peer, is_reply in (
                        (pair.client, pair.upstream, False),
                        (pair.upstream, pair.client, True),
                    ):
                        if sock not in watched and sock.fileno() != -1:
                            selector.register(sock, selectors.EVENT_READ)
                            watched[sock] = (pair, peer, is_reply)
            for key, _ in selector.select(timeout=0.01):
                ready = key.fileobj
                if ready is self._listener:
                    self._accept()
                    continue
                assert isinstance(ready, socket.socket)
                entry = watched.get(ready)
                if entry is None:
                    continue
                pair, peer, is_reply = entry
                try:
                    data = ready.recv(65536)
                except OSError:
                    data = b""
                if not is_reply and self._lose_from is not None and self._lose_from in data:
                    self._losing, self._lose_from = True, None
                if data and not (is_reply and self._losing):
                    try:
                        peer.sendall(data)
                    except OSError:
                        data = b""
                if not data:
                    for end in (pair.client, pair.upstream):
                        if end in watched:
                            selector.unregister(end)
                            del watched[end]
                    pair.close()
                    if pair in self._pairs:
                        self._pairs.remove(pair)
        selector.close()

    def _accept(self) -> None:
        self._connect()

    def __enter__(self) -> FaultyProxy:
        super().__enter__()
        return self


class LagProxy(_Proxy):
    """A faithful proxy whose replies wait :attr:`lag` seconds."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        super().__init__(upstream_port, host)
        #: Seconds each reply is held back (read once per reply, when it arrives from Redis).
        self.lag = 0.0
        self._requests: list[bytes] = []
        self._released = False

    def release(self) -> None:
        """No lag from now on, and every reply held so far delivered at once."""
        self.lag = 0.0
        self._released = True

    def sent(self) -> list[bytes]:
        """The chunks clients sent so far, in order (a command sent alone, or a pipeline, is one
        chunk on loopback)."""
        return list(self._requests)

    def requests(self, marker: bytes) -> int:
        """How many of the chunks clients sent so far held ``marker``."""
        return sum(1 for data in self.sent() if marker in data)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, None)
        while not self._stop.is_set():
            now = time.monotonic()
            wake = TICK
            if self._released:
                self._released = False
                for pair in self._pairs:
                    pair.due = collections.deque((now, data) for _, data in pair.due)
            for pair in list(self._pairs):
                while pair.due and pair.due[0][0] <= now:
                    _, data = pair.due.popleft()
                    try:
                        pair.client.sendall(data)
                    except OSError:
                        self._drop(selector, pair)
                        break
                if pair.due:
                    wake = min(wake, pair.due[0][0] - now)
            for key, _ in selector.select(timeout=max(0.0, wake)):
                if key.data is None:
                    self._accept(selector)
                    continue
                pair, is_reply = key.data
                try:
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                if not data:
                    self._drop(selector, pair)
                elif is_reply:
                    # In order behind those still held, even once the lag is back to 0.
                    pair.due.append((time.monotonic() + self.lag, data))
                else:
                    self._requests.append(data)
                    try:
                        pair.upstream.sendall(data)
                    except OSError:
                        self._drop(selector, pair)
        selector.close()

    def _drop(self, selector: selectors.BaseSelector, pair: _Pair) -> None:
        if pair not in self._pairs:
            return
        self._pairs.remove(pair)
        for sock in (pair.client, pair.upstream):
            try:
                selector.unregister(sock)
            except (KeyError, ValueError):
                pass
        pair.close()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        pair = self._connect()
        if pair is not None:
            selector.register(pair.client, selectors.EVENT_READ, (pair, False))
            selector.register(pair.upstream, selectors.EVENT_READ, (pair, True))

    def __enter__(self) -> LagProxy:
        super().__enter__()
        return self
