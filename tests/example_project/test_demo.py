"""``stampede demo`` end to end: the example Django site and Flask app served
by waitress in two processes each, stampeded on their stock Redis caches and
then on stampede. Figures are asserted as counts, never as durations."""

from __future__ import annotations

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

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TTL = 2
DURATION = 5.0
CLIENTS = 8


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stampede", "demo", *args],
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


def _started(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], list[int]]:
    """Start a long demo and read its log until its first servers are up; it and their pids."""
    process = subprocess.Popen(
        [sys.executable, "-m", "stampede", "demo", "--duration", "120", *args],
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


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
def document(demo: tuple[subprocess.CompletedProcess[str], Path]) -> dict[str, Any]:
    result, out = demo
    assert result.returncode == 0, result.stderr
    loaded: dict[str, Any] = json.loads((out / "demo.json").read_text())
    return loaded


@pytest.fixture(scope="module")
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


def test_tables_and_plot_are_written(demo: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, out = demo
    assert result.returncode == 0, result.stderr
    for heading in ("django", "flask", "expensive runs", "p99 ms"):
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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_stops_everything_it_started(sig: signal.Signals) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    process, pids = _started("--app", "flask", "--clients", "2", env=env)
    process.send_signal(sig)
    _, errors = process.communicate(timeout=60)
    assert process.returncode == 130, errors
    assert len(pids) == 3  # the redis-server and two app servers
    assert not [pid for pid in pids if _alive(pid)]


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
