"""Processes the demo starts and always stops: the example apps, each served
by waitress in its own process, and (when no Redis URL is given) a redis-server."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

__all__ = ["AppServers", "ServerError", "app_servers", "deferred_signals", "free_port"]

#: The directory holding ``example_project``: the servers import it from there.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
#: The signals that end the demo (Ctrl-C, ``kill``, a closed terminal): it handles
#: them itself from the start, even when it inherited them ignored.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class ServerError(RuntimeError):
    """An app server did not start or died; the message carries the end of its output."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold back Ctrl-C, SIGTERM and SIGHUP while cleaning up; a second Ctrl-C
    must not interrupt the stopping of servers. Re-raised as KeyboardInterrupt after."""
    received: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise KeyboardInterrupt


@dataclass(frozen=True)
class AppServers:
    """The running server processes of one app."""

    app: str
    ports: list[int]
    processes: list[subprocess.Popen[bytes]]
    logs: list[Path]

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def check(self) -> None:
        """Raise :class:`ServerError` if a server has exited."""
        for process, log in zip(self.processes, self.logs, strict=True):
            if process.poll() is not None:
                raise ServerError(
                    f"the {self.app} server (pid {process.pid}) exited with code {process.returncode}:\n"
                    f"{_tail(log)}"
                )


@contextlib.contextmanager
def app_servers(
    app: str, count: int, threads: int, env: Mapping[str, str], ready_timeout: float = 60.0
) -> Iterator[AppServers]:
    """Run ``count`` server processes of ``app`` (``django`` or ``flask``), ready to serve.

    Each process has ``threads`` worker threads and the environment ``env`` on
    top of this one. They are stopped on the way out, whatever happens (SIGTERM,
    then SIGKILL), and exit by themselves if this process dies (they watch their
    stdin). They die of SIGINT, SIGTERM and SIGHUP whatever this process ignores
    (``serve --exit-on-eof`` resets them).
    """
    environment = {**os.environ, **env}
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(SOURCE_ROOT), environment.get("PYTHONPATH")])
    )
    servers = AppServers(app, [], [], [])
    with tempfile.TemporaryDirectory(prefix="stampede-demo-") as logs:
        try:
            for index in range(count):
                port = free_port()
                log = Path(logs) / f"{app}-{index}.log"
                # Deferred: a signal between the start of a process and its noting would leak it.
                with log.open("wb") as out, deferred_signals():
                    process = subprocess.Popen(
                        [
                            sys.executable,
                            *("-m", "example_project.serve", app, "--exit-on-eof"),
                            *("--port", str(port), "--threads", str(threads)),
                        ],
                        env=environment,
                        stdin=subprocess.PIPE,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # Ctrl-C in the terminal is ours to handle
                    )
                    servers.processes.append(process)
                    servers.logs.append(log)
                    servers.ports.append(port)
            deadline = time.monotonic() + ready_timeout
            for port in servers.ports:
                _wait_ready(servers, port, deadline)
            yield servers
        finally:
            with deferred_signals():
                for process in servers.processes:
                    _stop(process)


def _wait_ready(servers: AppServers, port: int, deadline: float) -> None:
    """Poll the home page until it answers 200; a clear error if a process dies or it never does."""
    while True:
        servers.check()
        with contextlib.suppress(OSError, http.client.HTTPException):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
            try:
                connection.request("GET", "/", headers={"Host": "localhost"})
                if connection.getresponse().status == 200:
                    return
            finally:
                connection.close()
        if time.monotonic() > deadline:
            log = servers.logs[servers.ports.index(port)]
            raise ServerError(
                f"the {servers.app} server on port {port} did not answer in time:\n{_tail(log)}"
            )
        time.sleep(0.1)


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after a grace period: never leave a server behind."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
