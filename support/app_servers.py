"""Throwaway app servers for tests, benchmarks and demos: a WSGI or ASGI app, given by its import
path, served by one of the servers people deploy with, in a process group of its own on a free
loopback port; ready when it answers, always stopped.

>>> with AppServer("mysite.wsgi:application", "gunicorn-gthread", env={...}) as server:
...     urllib.request.urlopen(server.url("/page"))
...     server.errors()  # the exceptions its log shows, counted
...     server.pids()  # its processes: the master and its workers

The server is ``python -m <server>`` (see :data:`SERVERS`), run through :mod:`support.guard`, which kills
its whole process group when this process closes the server's stdin or dies. :meth:`AppServer.stop`
sends SIGTERM to the group, gives it :attr:`AppServer.stop_grace` seconds, then SIGKILLs what is
left. Its output goes to a log file, read for error messages and :meth:`AppServer.errors`.

Not part of the library: the apps are the caller's (tests, the benchmarks, the example
project), and so are the server packages (``pip install waitress`` and the like); this module
imports neither, and names no framework.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import http.client
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stampede.testing._closing import ClosedOnExit
from stampede.testing._ports import free_port

__all__ = ["SERVERS", "AppServer", "AppServerError", "Server"]

#: Seconds a server has to import its app and answer, by default.
READY_TIMEOUT = 60.0
#: Seconds a server has to exit after SIGTERM before its process group is killed, by default.
STOP_GRACE = 5.0
#: Seconds to wait for a killed server to be reaped: SIGKILL cannot be refused, so only a bound.
_REAPED_TIMEOUT = 10.0
_GUARD = Path(__file__).with_name("guard.py")
_HOST = "127.0.0.1"
_BACKLOG = "2048"

# The last line of a Python traceback: "redis.exceptions.ConnectionError: Too many connections".
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Timeout|Exit)(?::.*)?$")
# What Python prints between the tracebacks of a chain of exceptions.
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


class AppServerError(RuntimeError):
    """An app server could not be started, did not answer, or died; the message ends with the end
    of its log."""


@dataclass(frozen=True)
class Server:
    """A way to serve an app: a server's ``python -m`` command line.

    ``command`` is the module to run and its arguments, in which ``{app}`` (the app's import path,
    ``module:attribute``), ``{port}``, ``{threads}`` and ``{connections}`` (``threads`` + 100) are
    filled in; ``label`` too, for reports.
    """

    name: str
    label: str
    interface: Literal["wsgi", "asgi"]
    command: tuple[str, ...]
    #: The modules it needs: the server's package, its worker class's.
    requires: tuple[str, ...]
    #: Worker threads per process, for a server whose command takes a number (None: it takes none).
    threads: int | None = None
    #: Whether a request that waits holds no worker (an event loop's task, a greenlet) rather than
    #: one of a fixed number of threads or processes, so that other requests are served meanwhile.
    waits_free: bool = True

    def __post_init__(self) -> None:
        uses_threads = any("{threads}" in part for part in (self.label, *self.command))
        if uses_threads != (self.threads is not None):
            raise ValueError(f"server {self.name!r}: threads={self.threads} for command {self.command}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"server {self.name!r}: threads must be at least 1, got {self.threads}")

    def with_threads(self, threads: int) -> Server:
        """The same server with ``threads`` worker threads per process."""
        if self.threads is None:
            raise ValueError(f"{self.name} takes no number of threads")
        return dataclasses.replace(self, threads=threads)

    @property
    def described(self) -> str:
        """The label, with its numbers filled in: ``gunicorn -k gthread -w 2 --threads 40``."""
        return self._fill(self.label, app="", port=0)

    def argv(self, app: str, port: int) -> list[str]:
        """The command line that serves ``app`` on ``port``, run through the guard."""
        return [sys.executable, str(_GUARD), *(self._fill(part, app=app, port=port) for part in self.command)]

    def missing(self) -> list[str]:
        """The modules this server needs that cannot be imported here."""
        return [module for module in self.requires if not _importable(module)]

    def _fill(self, template: str, *, app: str, port: int) -> str:
        threads = self.threads or 0
        return template.format(app=app, port=port, threads=threads, connections=threads + 100)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a dotted name whose parent package is missing
        return False


_BIND = f"{_HOST}:{{port}}"
_GUNICORN = ("gunicorn", "-b", _BIND, "--backlog", _BACKLOG, "--timeout", "120", "--log-level", "warning")
_UVICORN = (
    *("uvicorn", "{app}", "--host", _HOST, "--port", "{port}", "--backlog", _BACKLOG),
    # No lifespan: the apps served here have no start-up or shutdown events.
    *("--lifespan", "off", "--log-level", "warning", "--no-access-log"),
)

#: The servers, by name.
SERVERS: Mapping[str, Server] = {
    server.name: server
    for server in (
        Server(
            "waitress",
            "waitress --threads {threads}",
            "wsgi",
            (
                *("waitress", f"--listen={_BIND}", "--threads={threads}"),
                # Every client at once is the point: accept them all (the default limit is 100),
                # none left queued in the backlog.
                *("--connection-limit={connections}", f"--backlog={_BACKLOG}"),
                # select() fails on descriptors above 1024: poll() has no such limit.
                *("--asyncore-use-poll", "{app}"),
            ),
            ("waitress",),
            threads=16,
            waits_free=False,
        ),
        Server(
            "gunicorn-sync",
            "gunicorn -w 8 --preload",
            "wsgi",
            (*_GUNICORN, "-w", "8", "--preload", "{app}"),
            ("gunicorn",),
            waits_free=False,
        ),
        Server(
            "gunicorn-gthread",
            "gunicorn -k gthread -w 2 --threads {threads}",
            "wsgi",
            (*_GUNICORN, "-k", "gthread", "-w", "2", "--threads", "{threads}", "{app}"),
            ("gunicorn",),
            threads=40,
            waits_free=False,
        ),
        Server(
            "gunicorn-gevent",
            "gunicorn -k gevent -w 2",
            "wsgi",
            (*_GUNICORN, "-k", "gevent", "-w", "2", "--worker-connections", "1000", "{app}"),
            ("gunicorn", "gevent"),
        ),
        Server("uvicorn", "uvicorn", "asgi", (*_UVICORN, "--workers", "1"), ("uvicorn",)),
        Server("uvicorn-2", "uvicorn --workers 2", "asgi", (*_UVICORN, "--workers", "2"), ("uvicorn",)),
        Server(
            "gunicorn-uvicorn",
            "gunicorn -k uvicorn_worker.UvicornWorker -w 2",
            "asgi",
            (*_GUNICORN, "-k", "uvicorn_worker.UvicornWorker", "-w", "2", "{app}"),
            ("gunicorn", "uvicorn_worker"),
        ),
        Server(
            "hypercorn",
            "hypercorn -w 2",
            "asgi",
            ("hypercorn", "-w", "2", "-b", _BIND, "--backlog", _BACKLOG, "{app}"),
            ("hypercorn",),
        ),
        Server(
            "daphne",
            "daphne",
            "asgi",
            ("daphne", "-b", _HOST, "-p", "{port}", "{app}"),
            ("daphne",),
        ),
    )
}


class AppServer(ClosedOnExit):
    """``app`` (an import path, ``module:attribute``) served by ``server`` (a name in
    :data:`SERVERS`, or a :class:`Server`) on a free loopback port, in a process group of its own.

    ``with AppServer(...) as running`` starts it and waits until ``GET ready_path`` answers 200;
    on the way out, whatever happens, it is stopped and its temporary log removed.
    """

    def __init__(
        self,
        app: str,
        server: str | Server = "waitress",
        *,
        threads: int | None = None,
        env: Mapping[str, str] | None = None,
        pythonpath: Sequence[str | os.PathLike[str]] = (),
        cwd: str | os.PathLike[str] | None = None,
        log: str | os.PathLike[str] | None = None,
        ready_path: str = "/",
        name: str | None = None,
        ready_timeout: float = READY_TIMEOUT,
        stop_grace: float = STOP_GRACE,
    ) -> None:
        """``threads``: worker threads per process, for a server that takes a number; ``env``: more
        environment for the server, on top of this process's; ``pythonpath``: directories put
        first on its ``PYTHONPATH`` (where the app's package is); ``cwd``: its working directory
        (the first entry of its ``sys.path``, as with ``python -m``); ``log``: the file its output
        goes to (default: a temporary one, removed by :meth:`close`); ``name``: what error messages
        call it (default: ``app``)."""
        if isinstance(server, str):
            try:
                server = SERVERS[server]
            except KeyError:
                raise ValueError(f"no server named {server!r}: one of {', '.join(SERVERS)}") from None
        self.server = server if threads is None else server.with_threads(threads)
        if ":" not in app:
            raise ValueError(f"app must be an import path, module:attribute; got {app!r}")
        if not ready_path.startswith("/"):
            raise ValueError(f"ready_path must start with /, got {ready_path!r}")
        if ready_timeout <= 0 or stop_grace < 0:
            raise ValueError(
                f"ready_timeout must be above 0 and stop_grace not below, got {ready_timeout}, {stop_grace}"
            )
        self.app = app
        self.name = name or app
        self.env = dict(env or {})
        self.pythonpath = [os.fspath(path) for path in pythonpath]
        self.cwd = cwd
        self.ready_path = ready_path
        self.ready_timeout = ready_timeout
        self.stop_grace = stop_grace
        self.port = free_port()
        self._own_log = log is None
        #: The file the server's output goes to.
        self.log = Path(tempfile.mkdtemp(prefix="stampede-app-"), "server.log") if log is None else Path(log)
        self._process: subprocess.Popen[bytes] | None = None

    # --- running ------------------------------------------------------------------------

    def url(self, path: str = "/") -> str:
        return f"http://{_HOST}:{self.port}{path}"

    @property
    def pid(self) -> int | None:
        """The server's process id (its master's, if it has workers) once started."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> AppServer:
        """Start the server process, without waiting for it to answer (see :meth:`wait_ready`)."""
        if self._process is not None:
            raise AppServerError(f"the {self.name} server is already started (pid {self._process.pid})")
        missing = self.server.missing()
        if missing:
            raise AppServerError(f"{self.server.described} needs {', '.join(missing)}: not installed")
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        path = [*self.pythonpath, *filter(None, [environment.get("PYTHONPATH")])]
        if path:
            environment["PYTHONPATH"] = os.pathsep.join(path)
        with self.log.open("wb") as output:
            self._process = subprocess.Popen(
                self.server.argv(self.app, self.port),
                env=environment,
                cwd=self.cwd,
                stdin=subprocess.PIPE,  # the guard's: its end closing, however, stops the server
                stdout=output,
                stderr=subprocess.STDOUT,
                # Its own session and process group: a Ctrl-C in the terminal is the caller's to
                # handle, and the group is what is stopped.
                start_new_session=True,
            )
        return self

    def wait_ready(self, deadline: float | None = None) -> AppServer:
        """Poll ``GET ready_path`` until it answers 200, until ``deadline`` (``time.monotonic()``;
        default: ``ready_timeout`` from now); :class:`AppServerError` if the process exits first
        or the deadline passes."""
        if deadline is None:
            deadline = time.monotonic() + self.ready_timeout
        while True:
            self.check()
            with contextlib.suppress(OSError, http.client.HTTPException):
                left = deadline - time.monotonic()
                if self.get(self.ready_path, timeout=min(2.0, max(0.1, left)))[0] == 200:
                    return self
            if time.monotonic() > deadline:
                raise AppServerError(
                    f"the {self.name} server ({self.server.described}, pid {self.pid}) did not answer "
                    f"GET {self.ready_path} on port {self.port} in time:\n{self.tail()}"
                )
            time.sleep(0.1)

    def check(self) -> None:
        """:class:`AppServerError` if the server is not running: never started, or exited."""
        if self._process is None:
            raise AppServerError(f"the {self.name} server is not started")
        code = self._process.poll()
        if code is not None:
            raise AppServerError(
                f"the {self.name} server (pid {self._process.pid}) exited with code {code}:\n{self.tail()}"
            )

    def get(self, path: str, *, timeout: float = 30.0) -> tuple[int, bytes]:
        """The status and body of ``GET path``, on a connection of its own."""
        connection = http.client.HTTPConnection(_HOST, self.port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def pids(self) -> list[int]:
        """The server's live processes: its own and the rest of its process group (the workers a
        master forked or spawned), to count what each holds."""
        if self._process is None:
            return []
        return _group(self._process.pid)

    # --- its log ------------------------------------------------------------------------

    def output(self) -> str:
        """All the server printed so far (tracebacks of failed requests, say)."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's output, for an error message."""
        return "\n".join(self.output().splitlines()[-lines:]) or "(no output)"

    def errors(self) -> collections.Counter[str]:
        """The exceptions the server's log shows, counted: the last line of each traceback, and of
        a chain of them (an exception raised while handling another) only the one raised last."""
        lines = self.output().splitlines()
        found: collections.Counter[str] = collections.Counter()
        for index, line in enumerate(lines):
            if not _EXCEPTION_LINE.match(line):
                continue
            following = next((later for later in lines[index + 1 :] if later.strip()), "")
            if not following.startswith(_CHAINED):
                found[" ".join(line.split())] += 1
        return found

    # --- stopping -----------------------------------------------------------------------

    def stop(self) -> None:
        """SIGTERM to the server's process group, ``stop_grace`` seconds to exit, then SIGKILL to
        what is left of it (workers that outlived their master too), and the server reaped."""
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.poll() is None:
                _signal_group(process.pid, signal.SIGTERM)
                deadline = time.monotonic() + self.stop_grace
                while not _exited(process) and time.monotonic() < deadline:
                    time.sleep(0.02)
        finally:
            # Until it is reaped, its master holds the id of the group: the group signalled is its.
            _signal_group(process.pid, signal.SIGKILL)
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()
            deadline = time.monotonic() + _REAPED_TIMEOUT
            while (left := _group(process.pid)) and time.monotonic() < deadline:
                time.sleep(0.01)  # SIGKILL takes effect when the process next runs
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            if left or process.returncode is None:
                raise AppServerError(
                    f"the {self.name} server (pid {process.pid}) was killed, but its processes "
                    f"{left or [process.pid]} are still there after {_REAPED_TIMEOUT:g} s"
                )

    def close(self) -> None:
        """Stop the server, and remove its log if it is a temporary one."""
        try:
            self.stop()
        finally:
            if self._own_log:
                shutil.rmtree(self.log.parent, ignore_errors=True)

    def __enter__(self) -> AppServer:
        try:
            return self.start().wait_ready()
        except BaseException:
            self.close()
            raise


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether ``process`` has exited, without reaping it where the system allows: reaped, its pid
    (the id of its process group) could be given to another process before the group is killed."""
    if process.returncode is not None:
        return True
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return process.poll() is not None
    try:
        return waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


def _group(pgid: int) -> list[int]:
    """The live (not zombie) processes of the process group ``pgid``."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return _group_from_ps(pgid)
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        state, _ppid, group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(group) == pgid and state != "Z":
            found.append(int(entry.name))
    return sorted(found)


def _group_from_ps(pgid: int) -> list[int]:
    listing = subprocess.run(
        ["ps", "-A", "-o", "pid=", "-o", "pgid=", "-o", "stat="],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    found = []
    for line in listing.splitlines():
        pid, group, state = line.split()[:3]
        if int(group) == pgid and not state.startswith("Z"):
            found.append(int(pid))
    return sorted(found)
