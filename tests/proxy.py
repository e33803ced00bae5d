"""A TCP proxy in front of a Redis that can lose replies, freeze, or cut its connections.

Faults injected for real, on the wire, rather than by patching the client:

- ``lose_replies()``: requests still reach Redis and run, their replies are
  dropped (a reply lost on the way back; the client times out and retries
  what already ran). ``lose_replies_from(marker)``: the same, from the first
  request that holds ``marker`` on (its own reply included).
- ``freeze()``: nothing moves either way; what was sent waits in the
  kernel's buffers and is delivered late on ``thaw()`` (a stalled link).
- ``cut()``: every open connection is closed at once (a reset).

One thread moves the bytes with ``selectors``; new connections are
accepted in every state, as a kernel would.
"""

from __future__ import annotations

import selectors
import socket
import threading
from types import TracebackType

__all__ = ["FaultyProxy"]


class _Pair:
    __slots__ = ("client", "upstream")

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream

    def close(self) -> None:
        for sock in (self.client, self.upstream):
            try:
                sock.close()
            except OSError:
                pass


class FaultyProxy:
    """``with FaultyProxy(redis_port) as proxy:`` clients connect to ``proxy.url``."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self._upstream = (host, upstream_port)
        self._listener = socket.create_server((host, 0))
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._pairs: list[_Pair] = []
        self._losing = False
        self._lose_from: bytes | None = None
        self._frozen = False
        self._cut = False
        self._stop = threading.Event()
        self._frozen_seen = threading.Event()  # set by the proxy's thread once frozen
        self._thread = threading.Thread(target=self._run, name="faulty-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://{self._upstream[0]}:{self.port}/0"

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
                sock = key.fileobj
                if sock is self._listener:
                    self._accept()
                    continue
                assert isinstance(sock, socket.socket)
                entry = watched.get(sock)
                if entry is None:
                    continue
                pair, peer, is_reply = entry
                try:
                    data = sock.recv(65536)
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
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(self._upstream, timeout=1.0)
        except OSError:
            client.close()  # Redis is down: refuse, as Redis itself would
            return
        for sock in (client, upstream):
            sock.settimeout(1.0)  # a peer that stops reading cannot stall the proxy for long
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._pairs.append(_Pair(client, upstream))

    def __enter__(self) -> FaultyProxy:
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
