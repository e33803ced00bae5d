"""An app server process for the many-waiters scenario: started on a free loopback port, ready
when it answers, always stopped; and the errors its log shows.

The process is ``python -m bench._apps.serve`` in a session of its own, its
output in a log file. It exits by itself if its stdin closes (this process
ended, however it ended); otherwise it is killed on the way out.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ._renders import ENV

__all__ = ["AppServer", "ServerError", "app_server", "errors_in_log", "free_port", "tail"]

#: The directory holding the ``bench`` package: the server imports it from there.
SOURCE_ROOT = Path(__file__).resolve().parents[1]
#: Seconds a server has to import its framework and answer ``/ready``.
READY_TIMEOUT = 60.0
#: Seconds a server has to exit once its stdin is closed, before it is killed.
STOP_GRACE = 3.0

# The last line of a Python traceback: "redis.exceptions.ConnectionError: Too many connections".
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Timeout|Exit)(?::.*)?$")
# What Python prints between the tracebacks of a chain of exceptions.
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


class ServerError(RuntimeError):
    """An app server did not start, or died; the message carries the end of its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class AppServer:
    """A running app server."""

    app: str
    server: str
    port: int
    log: Path
    process: subprocess.Popen[bytes]

    def check(self) -> None:
        """Raise :class:`ServerError` if the process has exited."""
        if self.process.poll() is not None:
            raise ServerError(
                f"the {self.app} server ({self.server}) exited with code {self.process.returncode}:\n"
                f"{tail(self.log)}"
            )


@contextlib.contextmanager
def app_server(
    app: str, *, server: str, threads: int, redis_url: str, namespace: str, renders: str
) -> Iterator[AppServer]:
    """Run ``app`` under ``server`` (``waitress`` with ``threads`` threads, or ``uvicorn``), ready to
    serve; its renders are counted in the file ``renders``. Stopped on the way out, whatever happens."""
    environment = {**os.environ, ENV: renders}
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(SOURCE_ROOT), environment.get("PYTHONPATH")])
    )
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="stampede-bench-") as logs:
        log = Path(logs) / f"{app}-{server}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    *("-m", "bench._apps.serve", app, "--server", server),
                    *("--port", str(port), "--threads", str(threads)),
                    *("--redis-url", redis_url, "--namespace", namespace),
                ],
                env=environment,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the terminal is the benchmark's to handle
            )
        running = AppServer(app, server, port, log, process)
        try:
            _wait_ready(running)
            yield running
        finally:
            _stop(process)


def _wait_ready(server: AppServer) -> None:
    """Poll ``/ready`` until it answers 200; a clear error if the process dies or it never does."""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        server.check()
        with contextlib.suppress(OSError, http.client.HTTPException):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=2.0)
            try:
                connection.request("GET", "/ready")
                if connection.getresponse().status == 200:
                    return
            finally:
                connection.close()
        if time.monotonic() > deadline:
            raise ServerError(
                f"the {server.app} server ({server.server}) on port {server.port} did not answer "
                f"within {READY_TIMEOUT:.0f} s:\n{tail(server.log)}"
            )
        time.sleep(0.1)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Close its stdin (it exits at once), then SIGKILL its session if it lingers: never leave one behind."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    try:
        process.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def tail(log: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of ``log``."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def errors_in_log(log: Path) -> collections.Counter[str]:
    """The exceptions a server's log shows, counted: the last line of each traceback, and of a chain
    of them (an exception raised while handling another) only the one raised last."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return collections.Counter()
    found: collections.Counter[str] = collections.Counter()
    for index, line in enumerate(lines):
        if not _EXCEPTION_LINE.match(line):
            continue
        following = next((later for later in lines[index + 1 :] if later.strip()), "")
        if not following.startswith(_CHAINED):
            found[" ".join(line.split())] += 1
    return found
