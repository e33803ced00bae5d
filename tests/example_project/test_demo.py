"""``stampede demo`` end to end: the example Django site and Flask app served
by waitress in two processes each, stampeded on their stock Redis caches and
then on stampede. Figures are asserted as counts, never as durations."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
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


def _serving() -> list[str]:
    """Example-app server processes still running (there must be none)."""
    found = subprocess.run(["pgrep", "-f", "example_project.serve"], capture_output=True, text=True)
    return found.stdout.split()


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
def figures(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> dict[tuple[str, str, str], dict[str, Any]]:
    result, out = demo
    assert result.returncode == 0, result.stderr
    document = json.loads((out / "demo.json").read_text())
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


def test_nothing_is_left_behind(
    demo: tuple[subprocess.CompletedProcess[str], Path], client: redis.Redis
) -> None:
    assert demo[0].returncode == 0, demo[0].stderr
    assert _serving() == []
    assert list(client.scan_iter(match="*demo-*")) == []


def test_without_a_redis_url_it_starts_and_stops_its_own(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    result = _demo(
        *("--app", "flask", "--clients", "2", "--duration", "1", "--rebuild-time", "0.2"),
        *("--output", str(tmp_path / "demo.png")),
        env=env,
    )
    assert result.returncode == 0, result.stderr
    started = re.search(r"started a redis-server for the demo at (\S+)", result.stderr)
    assert started is not None, result.stderr
    with (
        redis.Redis.from_url(started.group(1), socket_connect_timeout=2) as gone,
        pytest.raises(redis.ConnectionError),
    ):
        gone.ping()
    assert _serving() == []


def test_bad_options_are_refused_by_name() -> None:
    result = _demo("--clients", "none")
    assert result.returncode == 2
    assert "--clients" in result.stderr
