"""OPTIONS["ON_EVENT"]: a callable, its dotted path, or a list of them."""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django_stampede import StampedeCache
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stampede import EventKind
from stampede.prometheus import Metrics
from tests.observers import broken, record, recorded

URL = os.environ.get("STAMPEDE_TEST_REDIS_URL", "")
_namespaces = iter(range(10**6))


def namespace() -> str:
    return f"django-observed{os.getpid()}-{next(_namespaces)}"


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }


def test_a_list_of_hooks_sees_a_get_then_set() -> None:
    registry = CollectorRegistry()
    ns = namespace()
    cache = StampedeCache(
        URL,
        {
            "OPTIONS": {
                "NAMESPACE": ns,
                "ON_EVENT": [Metrics(registry), broken, "tests.observers.record"],
            }
        },
    )
    assert cache.get("page") is None  # a miss: this request rebuilds
    cache.set("page", "rendered")  # commits: the rebuild, timed from the get
    assert cache.get("page") == "rendered"
    cache.close()

    found = samples(registry)

    def value(name: str, **labels: str) -> float:
        return found.get((name, frozenset({"namespace": ns, **labels}.items())), 0.0)

    assert value("stampede_requests_total", result="miss") == 1
    assert value("stampede_requests_total", result="hit") == 1
    assert value("stampede_leases_total", outcome="won") == 1
    assert value("stampede_rebuilds_total", outcome="ok") == 1
    assert value("stampede_rebuild_duration_seconds_count") == 1
    # The hook after the broken one still saw every event.
    mine = recorded(ns)
    assert mine == [EventKind.MISS, EventKind.LEASE_WON, EventKind.REBUILD, EventKind.HIT]


def test_the_dotted_path_of_the_module_hook() -> None:
    ns = namespace()
    cache = StampedeCache(URL, {"OPTIONS": {"NAMESPACE": ns, "ON_EVENT": "stampede.prometheus.on_event"}})
    cache.set("k", 1)
    assert cache.get("k") == 1
    assert REGISTRY.get_sample_value("stampede_requests_total", {"namespace": ns, "result": "hit"}) == 1
    cache.close()


def test_backends_with_the_same_list_of_hooks_share_one_core() -> None:
    # Django makes a backend per thread and task: a list read again must not
    # make another core (and another connection pool) each time.
    metrics = Metrics(CollectorRegistry())
    params: dict[str, Any] = {"OPTIONS": {"ON_EVENT": [metrics, "tests.observers.record"]}}
    assert StampedeCache(URL, params).stampede is StampedeCache(URL, params).stampede
    other: dict[str, Any] = {"OPTIONS": {"ON_EVENT": [metrics]}}
    assert StampedeCache(URL, other).stampede is not StampedeCache(URL, params).stampede


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (42, r"^django_stampede: OPTIONS\['ON_EVENT'\] must be a callable, its dotted path, or a list"),
        ("nope.missing", r"^django_stampede: OPTIONS\['ON_EVENT'\] 'nope.missing' cannot be imported"),
        (
            [record, "stampede.nothing"],
            r"^django_stampede: OPTIONS\['ON_EVENT'\]\[1\] 'stampede.nothing' cannot be imported",
        ),
        ("stampede.prometheus.Metrics", r"OPTIONS\['ON_EVENT'\] names the class Metrics: give an instance"),
    ],
)
def test_a_bad_hook_names_the_setting(setting: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        StampedeCache(URL, {"OPTIONS": {"ON_EVENT": setting}})
