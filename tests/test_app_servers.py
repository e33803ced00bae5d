"""The app servers of the tests, benchmarks and demo (``support.app_servers``): every server
serves, answers and is stopped with all its processes; a server dies with whatever started it,
even a killed process; a server that cannot start says why, and the errors of its log are
counted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import stampede.testing
from support.app_servers import SERVERS, AppServer, AppServerError, Server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state != "Z"


def _gone(pids: list[int], bound: float = 30.0) -> bool:
    """Whether every one of ``pids`` has stopped, within ``bound`` seconds (a bound, not a
    measurement: a SIGKILL takes effect when the process next runs)."""
    deadline = time.monotonic() + bound
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(pid) for pid in pids)


def _checked_until_it_exits(server: AppServer, bound: float = 30.0) -> None:
    """``server.check()`` until it raises, for ``bound`` seconds at most."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        server.check()
        time.sleep(0.05)


def _server(name: str) -> Server:
    server = SERVERS[name]
    if server.missing():
        pytest.fail(f"{server.described} needs {', '.join(server.missing())}: install the test extra")
    return server


def _app(server: Server) -> str:
    return f"tests.app_server_app:{server.interface}"


@pytest.mark.parametrize("name", list(SERVERS))
def test_every_server_serves_and_is_stopped_with_all_its_processes(name: str, tmp_path: Path) -> None:
    server = _server(name)
    with AppServer(_app(server), server, pythonpath=[ROOT], log=tmp_path / "server.log") as running:
        status, body = running.get("/")
        assert status == 200
        pids = running.pids()
        assert running.pid in pids
        assert int(body) in pids  # the process that answered is one of the group's
    assert running.pid is None
    assert _gone(pids), [pid for pid in pids if _alive(pid)]


def test_the_errors_in_its_log_are_counted(tmp_path: Path) -> None:
    server = _server("waitress")
    with AppServer(_app(server), server, pythonpath=[ROOT], log=tmp_path / "server.log") as running:
        assert running.get("/boom") == (500, b"failed")
        assert running.get("/boom") == (500, b"failed")
        deadline = time.monotonic() + 10  # the log is written as the request ends
        while sum(running.errors().values()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # Of a chain of exceptions, only the last one raised.
        assert running.errors() == {"RuntimeError: boom": 2}, running.output()


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    server = AppServer(
        "tests.app_server_app:wsgi",
        "waitress",
        env={"APP_SERVER_APP_BROKEN": "1"},
        pythonpath=[ROOT],
        log=tmp_path / "server.log",
        name="broken",
    )
    with pytest.raises(AppServerError, match=r"the broken server \(pid \d+\) exited") as raised:
        server.__enter__()
    assert "RuntimeError: the app cannot start" in str(raised.value)
    assert server.pid is None  # stopped on the way out


def test_a_server_that_dies_is_found_out(tmp_path: Path) -> None:
    server = _server("gunicorn-gthread")
    with AppServer(_app(server), server, pythonpath=[ROOT], log=tmp_path / "server.log") as running:
        assert running.pid is not None
        workers = [pid for pid in running.pids() if pid != running.pid]
        os.kill(running.pid, signal.SIGKILL)
        with pytest.raises(AppServerError, match=r"exited with code -9"):
            _checked_until_it_exits(running)
    assert _gone(workers)  # the workers its master left are stopped with the group


@pytest.mark.parametrize("name", ["waitress", "gunicorn-sync", "uvicorn-2"])
def test_no_server_outlives_a_killed_parent(name: str, tmp_path: Path) -> None:
    server = _server(name)
    # A parent that starts a server, says its processes, and waits to be killed: no cleanup runs.
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import time
                from support.app_servers import AppServer
                server = AppServer({_app(server)!r}, {name!r}, pythonpath=[{str(ROOT)!r}]).start()
                server.wait_ready()
                print(server.pid, *server.pids(), flush=True)
                time.sleep(300)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    ) as parent:
        try:
            assert parent.stdout is not None
            group, *pids = [int(pid) for pid in parent.stdout.readline().split()]
        finally:
            parent.kill()  # no cleanup runs in it
            parent.wait(30)
    try:
        assert _gone(pids), [pid for pid in pids if _alive(pid)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)  # after a failure: nothing left behind


def test_stop_signals_a_parent_ignored_are_not_inherited(tmp_path: Path) -> None:
    server = _server("waitress")
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        running = AppServer(_app(server), server, pythonpath=[ROOT], log=tmp_path / "server.log").start()
    finally:
        signal.signal(signal.SIGHUP, previous)
    try:
        running.wait_ready()
        assert running.pid is not None
        os.kill(running.pid, signal.SIGHUP)
        with pytest.raises(AppServerError, match=f"exited with code -{int(signal.SIGHUP)}"):
            _checked_until_it_exits(running)
    finally:
        running.close()


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no server named 'tornado'"):
        AppServer("app:wsgi", "tornado")
    with pytest.raises(ValueError, match="module:attribute"):
        AppServer("app", "waitress")
    with pytest.raises(ValueError, match="uvicorn takes no number of threads"):
        AppServer("app:asgi", "uvicorn", threads=4)


def test_it_is_not_exported() -> None:
    assert not {"AppServer", "SERVERS", "AppServerError"} & set(stampede.testing.__all__)
