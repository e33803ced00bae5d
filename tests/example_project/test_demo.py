"""The demo (``python -m example_project.demo``) end to end: the example Django
site and Flask app served by waitress in two processes each, stampeded on their
stock Redis caches and then on stampede. Figures are asserted as counts, never
as durations."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

# One worker under pytest-xdist (--dist loadgroup): the tests reading the
# demo's one run share a session-scoped fixture, which runs once per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo")]

ROOT = Path(__file__).resolve().parents[2]
DEMO = (sys.executable, "-m", "example_project.demo")
TTL = 2
DURATION = 5.0
CLIENTS = 8
#: The signals that stop the demo; a background job of a script starts with SIGINT
#: ignored (nohup: SIGHUP), which the demo must not inherit as is.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEMO, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids_of(document: dict[str, Any]) -> list[int]:
    processes = document["processes"]
    return [*processes["servers"], *([processes["redis"]] if processes["redis"] else [])]


def _ignored_signals(pid: int) -> set[int] | None:
    """The signals ``pid`` ignores, from /proc (None where there is no /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    (mask,) = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigIgn:")]
    return {sig for sig in range(1, 65) if mask & (1 << (sig - 1))}


def _started(
    *args: str, env: dict[str, str] | None = None, ignoring: bool = False
) -> tuple[subprocess.Popen[str], list[int]]:
    """Start a long demo and read its log until its first servers are up; it and their pids.

    ``ignoring``: start it with SIGINT and SIGHUP ignored, as a background job of a
    script does SIGINT and ``nohup`` SIGHUP (``trap ""`` ignores them; ``exec`` keeps that).
    """
    command = [*DEMO, "--duration", "120", *args]
    if ignoring:
        command = ["/bin/sh", "-c", 'trap "" INT HUP; exec "$@"', "sh", *command]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    pids: list[int] = []
    for line in process.stderr:
        found = re.search(r"\(pid (\d+)\)|\(pids \[([\d, ]+)\]\)", line)
        if found and found.group(1):
            pids.append(int(found.group(1)))
        elif found:
            pids += [int(pid) for pid in found.group(2).split(",")]
            return process, pids
    process.kill()
    raise AssertionError(f"the demo ended before serving (code {process.wait()})")


@pytest.fixture(scope="session")
def demo(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("demo")
    result = _demo(
        *("--clients", str(CLIENTS), "--duration", str(DURATION), "--ttl", str(TTL)),
        *("--rebuild-time", "0.5", "--redis-url", redis_url),
        *("--output", str(out / "demo.png"), "--json", str(out / "demo.json")),
    )
    return result, out


@pytest.fixture(scope="session")
def document(demo: tuple[subprocess.CompletedProcess[str], Path]) -> dict[str, Any]:
    result, out = demo
    assert result.returncode == 0, result.stderr
    loaded: dict[str, Any] = json.loads((out / "demo.json").read_text())
    return loaded


@pytest.fixture(scope="session")
def figures(document: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(s["app"], s["cache"], s["page"]): s for s in document["summaries"]}


@pytest.mark.parametrize("app", ["django", "flask"])
def test_stampede_runs_the_expensive_code_once_per_expiry(
    figures: dict[tuple[str, str, str], dict[str, Any]], app: str
) -> None:
    # Each page is built at the start and then at most once per TTL.
    bound = math.ceil(DURATION / TTL) + 1
    for page in ("report", "dashboard"):
        ours = figures[(app, "stampede", page)]
        assert 1 <= ours["expensive_runs"] <= bound, ours
    stock, ours = figures[(app, "stock", "all")], figures[(app, "stampede", "all")]
    assert ours["expensive_runs"] < stock["expensive_runs"], (ours, stock)
    assert ours["slow"] < stock["slow"], (ours, stock)


@pytest.mark.parametrize("app", ["django", "flask"])
def test_stale_pages_are_served_while_one_request_refreshes(
    figures: dict[tuple[str, str, str], dict[str, Any]], app: str
) -> None:
    assert figures[(app, "stampede", "all")]["stale"] > 0


def test_no_request_fails(figures: dict[tuple[str, str, str], dict[str, Any]]) -> None:
    for summary in figures.values():
        assert summary["errors"] == 0, summary
        assert summary["requests"] > 0, summary


@pytest.mark.parametrize("app", ["django", "flask"])
def test_redis_is_sampled_on_both_caches(
    document: dict[str, Any], figures: dict[tuple[str, str, str], dict[str, Any]], app: str
) -> None:
    runs = {run["cache"]: run for run in document["redis"] if run["app"] == app}
    assert set(runs) == {"stock", "stampede"}
    for cache, run in runs.items():
        samples = run["samples"]
        assert len(samples) >= 2, run
        for sample in samples:
            assert sample["commands"] >= 0, sample
            assert sample["commands_per_second"] >= 0, sample
            assert sample["clients"] >= 0, sample
            assert sample["interval"] > 0, sample
        # The samples cover the whole run: the last one is taken after the load stopped.
        assert samples[-1]["at"] >= DURATION, samples[-1]
        # Counts: every page is read from Redis, over connections the app servers keep.
        assert run["commands"] == sum(sample["commands"] for sample in samples) > 0, run
        assert run["requests"] == figures[(app, cache, "all")]["requests"], run
        assert run["commands_per_request"] == pytest.approx(run["commands"] / run["requests"], abs=1e-3)
        assert run["max_clients"] == max(sample["clients"] for sample in samples) > 0, run
        assert run["baseline_clients"] >= 1, run  # the sampler's own connection at least


def test_tables_and_plot_are_written(demo: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, out = demo
    assert result.returncode == 0, result.stderr
    for heading in ("django", "flask", "expensive runs", "p99 ms", "django in Redis", "flask in Redis"):
        assert heading in result.stdout
    assert f"plot: {out / 'demo.png'}" in result.stdout
    assert (out / "demo.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_nothing_is_left_behind(document: dict[str, Any], client: redis.Redis) -> None:
    servers = document["processes"]["servers"]
    assert len(servers) == 2 * 2 * 2  # two processes per app and cache
    assert not [pid for pid in servers if _alive(pid)]
    assert list(client.scan_iter(match="*demo-*")) == []


def test_without_a_redis_url_it_starts_and_stops_its_own(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    result = _demo(
        *("--app", "flask", "--clients", "2", "--duration", "1", "--rebuild-time", "0.2"),
        *("--output", str(tmp_path / "demo.png"), "--json", str(tmp_path / "demo.json")),
        env=env,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "demo.json").read_text())
    assert document["processes"]["redis"] is not None
    assert not [pid for pid in _pids_of(document) if _alive(pid)]


def _kill_leftovers(process: subprocess.Popen[str], pids: list[int]) -> None:
    """After a failure: leave nothing behind to fail the next test."""
    if process.poll() is None:
        process.kill()
        process.communicate(timeout=60)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # each runs in its own session


@pytest.mark.parametrize("inherited", ["as-run", "ignored"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_stops_everything_it_started(sig: signal.Signals, inherited: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    process, pids = _started("--app", "flask", "--clients", "2", env=env, ignoring=inherited == "ignored")
    try:
        assert len(pids) == 3  # the redis-server and two app servers
        # Whatever it inherited, the demo handles the stop signals, and its app
        # servers die of them (redis-server handles SIGINT and SIGTERM itself).
        for pid in [process.pid, *pids[1:]]:
            ignored = _ignored_signals(pid)
            assert ignored is None or not ignored & set(STOP_SIGNALS), (pid, ignored)
        process.send_signal(sig)
        _, errors = process.communicate(timeout=60)
        assert process.returncode == 130, errors
        assert "interrupted; everything the demo started is stopped" in errors
        assert not [pid for pid in pids if _alive(pid)]
    finally:
        _kill_leftovers(process, pids)


def test_a_server_that_dies_fails_the_run_by_name(redis_url: str) -> None:
    process, pids = _started("--app", "django", "--clients", "2", "--redis-url", redis_url)
    os.kill(pids[0], signal.SIGKILL)
    _, errors = process.communicate(timeout=60)
    assert process.returncode == 1, errors
    assert f"the django server (pid {pids[0]}) exited" in errors
    assert not [pid for pid in pids if _alive(pid)]


def test_bad_options_are_refused_by_name() -> None:
    result = _demo("--clients", "none")
    assert result.returncode == 2
    assert "--clients" in result.stderr


def test_servers_do_not_outlive_a_killed_demo(redis_url: str) -> None:
    process, pids = _started("--app", "flask", "--clients", "2", "--redis-url", redis_url)
    process.kill()  # no cleanup runs: the servers notice their stdin close
    process.communicate(timeout=60)
    deadline = time.monotonic() + 30  # a bound on the wait, not an assertion on time
    while [pid for pid in pids if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if _alive(pid)]
