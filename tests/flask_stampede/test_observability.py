"""STAMPEDE_ON_EVENT and Flask-Caching's CACHE_OPTIONS["on_event"]: a
callable, its dotted path, or a list of them."""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import stampede
from stampede import EventKind
from stampede.prometheus import Metrics
from tests.flask_stampede.app import make_app
from tests.observers import broken, record, recorded

_namespaces = itertools.count()


def test_stampede_on_event_sees_a_cached_view_and_a_memoized_coroutine() -> None:
    registry = CollectorRegistry()
    app, _, _, expensive = make_app(
        SECRET_KEY="only-for-tests",
        STAMPEDE_ON_EVENT=[Metrics(registry), broken, "tests.observers.record"],
    )
    namespace = app.config["STAMPEDE_NAMESPACE"]
    client = app.test_client()
    assert client.get("/page").text == "render 1"
    assert client.get("/page").text == "render 1"
    assert recorded(namespace) == [EventKind.MISS, EventKind.LEASE_WON, EventKind.REBUILD, EventKind.HIT]
    labels = {"namespace": namespace}
    assert registry.get_sample_value("stampede_requests_total", {**labels, "result": "miss"}) == 1
    assert registry.get_sample_value("stampede_requests_total", {**labels, "result": "hit"}) == 1
    assert registry.get_sample_value("stampede_rebuild_duration_seconds_count", labels) == 1

    # The asyncio core (memoized coroutines) reports to the same hooks.
    async_square = app.extensions["test"]["async_square"]
    with app.app_context():
        assert app.ensure_sync(async_square)(3) == 9
    assert recorded(namespace)[4:] == [EventKind.MISS, EventKind.LEASE_WON, EventKind.REBUILD]
    assert registry.get_sample_value("stampede_rebuilds_total", {**labels, "outcome": "ok"}) == 2
    assert expensive.runs == 2


def test_flask_caching_on_event() -> None:
    namespace = f"flask-observed{os.getpid()}-{next(_namespaces)}"
    app, _, _, _ = make_app(
        SECRET_KEY="only-for-tests",
        CACHE_OPTIONS={
            "namespace": namespace,
            "stale_ttl": 30,
            "on_event": "tests.observers.record",
        },
    )
    client = app.test_client()
    assert client.get("/flask-caching").text == "render 1"
    assert client.get("/flask-caching").text == "render 1"
    assert recorded(namespace) == [
        EventKind.MISS,
        EventKind.LEASE_WON,
        EventKind.REBUILD,
        EventKind.HIT,
    ]
    app.extensions["cache"][next(iter(app.extensions["cache"]))].clear()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"STAMPEDE_ON_EVENT": 42},
            r"^flask_stampede: STAMPEDE_ON_EVENT must be a callable, its dotted path",
        ),
        (
            {"STAMPEDE_ON_EVENT": [record, "nope.missing"]},
            r"^flask_stampede: STAMPEDE_ON_EVENT\[1\] 'nope.missing' cannot be imported",
        ),
        (
            {"CACHE_OPTIONS": {"namespace": "x", "on_event": "nope.missing"}},
            r"^flask_stampede: CACHE_OPTIONS\['on_event'\] 'nope.missing' cannot be imported",
        ),
        (
            {"CACHE_OPTIONS": {"namespace": "x", "on_event": [42]}},
            r"^flask_stampede: CACHE_OPTIONS\['on_event'\]\[0\] must be a callable or its dotted path",
        ),
    ],
)
def test_a_bad_hook_names_the_setting(config: dict[str, Any], message: str) -> None:
    with pytest.raises(stampede.ConfigurationError, match=message):
        make_app(SECRET_KEY="only-for-tests", **config)
