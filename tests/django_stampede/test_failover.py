"""The Django backend through a failover, configured by LOCATION alone: the
master of the keys is killed while threads of a request-serving process read
them (a cluster, and a Sentinel service in django-redis's terms)."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import django_stampede
import pytest

from stampede._core.keys import KeySpace
from tests.failing import Failing

pytestmark = pytest.mark.slow


@pytest.fixture(params=["cluster", "sentinel"])
def failing(request: pytest.FixtureRequest) -> Iterator[Failing]:
    with Failing(request.param, None) as setup:
        yield setup


def test_no_error_and_no_extra_rebuild_through_a_failover(failing: Failing, namespace: str) -> None:
    if failing.kind == "cluster":
        location, options = failing.url, {}
    else:  # django-redis's Sentinel terms
        location = f"redis://{failing.setup.service}/0"  # type: ignore[union-attr]
        options = {"SENTINELS": failing.setup.sentinel_addresses}  # type: ignore[union-attr]
    params: dict[str, Any] = {"OPTIONS": {"NAMESPACE": namespace, "WAIT_TIMEOUT": 30, **options}}
    cache = django_stampede.StampedeCache(location, params)
    keys = [f"page-{i}" for i in range(12)]
    renders: collections.Counter[str] = collections.Counter()

    def render(key: str) -> str:
        renders[key] += 1
        return f"<html>{key}</html>"

    for key in keys:
        assert cache.get_or_set(key, lambda key=key: render(key), 60) == f"<html>{key}</html>"

    def serve() -> None:
        for key in keys:
            assert cache.get_or_set(key, lambda key=key: render(key), 60) == f"<html>{key}</html>"
            assert cache.get(key) == f"<html>{key}</html>"

    errors = failing.serve_through_failover(
        KeySpace(namespace)(cache.make_key(keys[0])).value, serve, threads=8
    )
    cache.close()
    assert errors == []
    assert set(renders.values()) == {1}
