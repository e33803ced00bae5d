"""The example Django site passes Django's system checks with either cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MANAGE = Path(__file__).resolve().parents[2] / "example_project" / "manage.py"


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
