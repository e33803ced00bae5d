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
from pathlib import Path

__all__ = ["ServerError", "app_servers", "free_port"]

#: The directory holding ``example_project``: the servers import it from there.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


class ServerError(RuntimeError):
    """An app server did not start; the message carries the end of its output."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def app_servers(
    app: str, count: int, threads: int, env: Mapping[str, str], ready_timeout: float = 60.0
) -> Iterator[list[int]]:
    """Run ``count`` server processes of ``app`` (``django`` or ``flask``); their ports.

    Each process has ``threads`` worker threads and the environment ``env`` on
    top of this one. They are stopped on the way out, whatever happens.
    """
    environment = {**os.environ, **env}
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(SOURCE_ROOT), environment.get("PYTHONPATH")])
    )
    processes: list[tuple[subprocess.Popen[bytes], Path]] = []
    ports: list[int] = []
    with tempfile.TemporaryDirectory(prefix="stampede-demo-") as logs:
        try:
            for index in range(count):
                port = free_port()
                log = Path(logs) / f"{app}-{index}.log"
                with log.open("wb") as out:
                    process = subprocess.Popen(
                        [
                            sys.executable,
                            *("-m", "example_project.serve", app),
                            *("--port", str(port), "--threads", str(threads)),
                        ],
                        env=environment,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # Ctrl-C in the terminal is ours to handle
                    )
                processes.append((process, log))
                ports.append(port)
            deadline = time.monotonic() + ready_timeout
            for (process, log), port in zip(processes, ports, strict=True):
                _wait_ready(app, process, log, port, deadline)
            yield ports
        finally:
            for process, _ in processes:
                _stop(process)


def _wait_ready(app: str, process: subprocess.Popen[bytes], log: Path, port: int, deadline: float) -> None:
    """Poll the home page until it answers 200; a clear error if the process dies or never does."""
    while True:
        if process.poll() is not None:
            raise ServerError(f"the {app} server exited with code {process.returncode}:\n{_tail(log)}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
            try:
                connection.request("GET", "/")
                if connection.getresponse().status == 200:
                    return
            finally:
                connection.close()
        if time.monotonic() > deadline:
            raise ServerError(f"the {app} server on port {port} did not answer in time:\n{_tail(log)}")
        time.sleep(0.1)


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after a grace period: never leave a server behind."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
