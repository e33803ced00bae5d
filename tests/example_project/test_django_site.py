"""The example Django site passes Django's system checks with either cache."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from example_project.expensive import runs_key
from support.app_servers import AppServer

ROOT = Path(__file__).resolve().parents[2]
MANAGE = ROOT / "example_project" / "manage.py"


@pytest.mark.parametrize("cache", ["stampede", "stock"])
def test_the_site_passes_djangos_checks(redis_url: str, cache: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url, "EXAMPLE_CACHE": cache}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, str(MANAGE), "check", "--deploy", "--fail-level", "ERROR"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_manage_py_stampede_looks_inside_the_sites_cache(redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url, "EXAMPLE_CACHE": "stampede"}
    env.pop("DJANGO_SETTINGS_MODULE", None)

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(MANAGE), "stampede", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    shown = manage("--help")
    assert shown.returncode == 0, shown.stderr
    assert "Commands: inspect KEY..." in " ".join(shown.stdout.split())
    inspected = manage("inspect", "never-written")
    assert inspected.returncode == 0, inspected.stderr
    assert inspected.stdout.startswith("never-written: missing (no value)")


def test_a_bad_cache_setting_is_named(redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url, "EXAMPLE_CACHE": "memcached"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, str(MANAGE), "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "EXAMPLE_CACHE" in result.stderr


def post(port: int, path: str, form: str) -> int:
    """The status of a form's POST (its redirect not followed)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, form, {"Content-Type": "application/x-www-form-urlencoded"})
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.mark.parametrize("cache", ["stampede", "stock"])
def test_saving_a_product_marks_its_pages_stale(
    redis_url: str, client: redis.Redis, namespace: str, cache: str, tmp_path: Path
) -> None:
    # Under a real server (waitress), with the site's own settings: its
    # post_save receiver invalidates the product's tag.
    prefix = f"{namespace}-{cache}"
    env = {
        "REDIS_URL": redis_url,
        "EXAMPLE_CACHE": cache,
        "EXAMPLE_KEY_PREFIX": prefix,
        "EXAMPLE_DATABASE": str(tmp_path / "example.sqlite3"),
        "EXAMPLE_REBUILD_SECONDS": "0",
        "DJANGO_SETTINGS_MODULE": "example_project.django_site.settings",
    }
    app = "example_project.django_site.wsgi:application"
    with AppServer(app, "waitress", env=env, pythonpath=[ROOT], log=tmp_path / "server.log") as site:
        first = site.get("/products/1/")[1]
        assert b'data-price="249.00"' in first
        other = site.get("/products/2/")[1]
        assert site.get("/products/1/")[1] == first  # cached
        assert post(site.port, "/products/1/edit/", "price=199.50") == 302
        again = site.get("/products/1/")[1]
        assert site.get("/products/2/")[1] == other
    runs = [entry.decode().split()[0] for entry in client.lrange(runs_key(prefix), 0, -1)]
    if cache == "stampede":
        assert b'data-price="199.50"' in again  # rendered again, once
        assert runs == ["django:product-1", "django:product-2", "django:product-1"]
    else:
        assert again == first  # Django's RedisCache has no groups: stale until it expires
        assert runs == ["django:product-1", "django:product-2"]
