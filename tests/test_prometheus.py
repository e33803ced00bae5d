"""stampede.prometheus: the metrics of every event, counted on real Redis."""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client import Counter as PrometheusCounter
from prometheus_client.parser import text_string_to_metric_families

import stampede
import stampede.opentelemetry
import stampede.prometheus
from stampede import Event, EventKind
from stampede._core.measures import MEASURES
from stampede.prometheus import Metrics
from tests.helpers import Rebuilds, run_threads, wait_until
from tests.observers import Recorder

KEY = "report:daily"


class Scraped:
    """What ``generate_latest(registry)`` says, as Prometheus would parse it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.types: dict[str, str] = {}
        self.samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            self.types[family.name] = family.type
            for sample in family.samples:
                self.samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value

    def __call__(self, name: str, **labels: str) -> float:
        """A sample's value; 0 if absent (a counter never incremented)."""
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def label_names(self) -> set[str]:
        return {name for _, labels in self.samples for name, _ in labels}


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_a_cold_key_hit_by_16_callers_then_a_stale_refresh(
    client: redis.Redis, namespace: str, registry: CollectorRegistry
) -> None:
    """16 threads, each with a Stampede of its own (16 processes, as far as
    Redis knows), on a cold key: one rebuilds, 15 find the lease busy and
    wait. Then the value goes stale: one caller refreshes it while another
    is served the stale value."""
    seen = Recorder()
    hook = stampede.hook_from([Metrics(registry=registry), seen])
    callers = [
        stampede.Stampede(client, namespace=namespace, on_event=hook, stale_ttl=600, wait_timeout=30)
        for _ in range(16)
    ]
    mine = iter(callers)
    lock = threading.Lock()

    def rebuild() -> str:
        # Held until the 15 others are queued behind the lease: the counts
        # below do not depend on how the threads were scheduled.
        wait_until(lambda: seen.count(EventKind.LEASE_BUSY) == 15, timeout=30)
        return "v1"

    def call() -> Any:
        with lock:
            sf = next(mine)
        return sf.get_or_rebuild(KEY, rebuild, ttl=60)

    assert run_threads(16, call) == ["v1"] * 16
    cold = Scraped(registry)
    assert cold("stampede_requests_total", namespace=namespace, result="miss") == 16
    assert cold("stampede_leases_total", namespace=namespace, outcome="won") == 1
    assert cold("stampede_leases_total", namespace=namespace, outcome="busy") == 15
    assert cold("stampede_waits_total", namespace=namespace) == 15
    assert cold("stampede_wait_duration_seconds_count", namespace=namespace) == 15
    assert cold("stampede_rebuilds_total", namespace=namespace, outcome="ok") == 1
    assert cold("stampede_rebuild_duration_seconds_count", namespace=namespace) == 1
    assert cold("stampede_wait_timeouts_total", namespace=namespace) == 0

    # Stale: one caller refreshes (held open), another is served the stale value.
    callers[0].invalidate(KEY)
    gate = threading.Event()
    slow = Rebuilds(result=lambda n: gate.wait(30) and "v2")
    refresher = threading.Thread(target=lambda: callers[1].get_or_rebuild(KEY, slow, ttl=60))
    refresher.start()
    assert slow.started.wait(30)
    assert callers[2].get_or_rebuild(KEY, Rebuilds(), ttl=60) == "v1"  # stale, at once
    gate.set()
    refresher.join(30)
    assert callers[3].get_or_rebuild(KEY, Rebuilds(), ttl=60) == "v2"

    after = Scraped(registry)
    assert after("stampede_requests_total", namespace=namespace, result="stale_hit") == 1
    assert after("stampede_requests_total", namespace=namespace, result="hit") == 1
    assert after("stampede_leases_total", namespace=namespace, outcome="won") == 2
    assert after("stampede_rebuilds_total", namespace=namespace, outcome="ok") == 2
    assert after("stampede_rebuild_duration_seconds_count", namespace=namespace) == 2
    assert after("stampede_rebuild_duration_seconds_bucket", namespace=namespace, le="+Inf") == 2
    assert after("stampede_rebuild_duration_seconds_sum", namespace=namespace) > 0
    assert after.types["stampede_rebuild_duration_seconds"] == "histogram"
    assert after.types["stampede_wait_duration_seconds"] == "histogram"
    assert after.types["stampede_requests"] == "counter"
    # Buckets from a millisecond to minutes; never a label of the key.
    bounds = {
        le for name, labels in after.samples if name.endswith("_bucket") for key, le in labels if key == "le"
    }
    assert {"0.001", "1.0", "60.0", "300.0", "+Inf"} <= bounds
    assert after.label_names() <= {"namespace", "result", "outcome", "reason", "error_type", "le"}
    for caller in callers:
        caller.close()


def test_one_instance_shared_by_16_threads_rebuilds_once(
    client: redis.Redis, namespace: str, registry: CollectorRegistry
) -> None:
    sf = stampede.Stampede(client, namespace=namespace, on_event=Metrics(registry), wait_timeout=30)
    rebuilds = Rebuilds(delay=0.5)
    assert run_threads(16, lambda: sf.get_or_rebuild(KEY, rebuilds, ttl=60)) == ["v1"] * 16
    scraped = Scraped(registry)
    assert rebuilds.count == 1
    assert scraped("stampede_rebuilds_total", namespace=namespace, outcome="ok") == 1
    assert scraped("stampede_rebuild_duration_seconds_count", namespace=namespace) == 1
    assert scraped("stampede_leases_total", namespace=namespace, outcome="won") >= 1
    sf.close()


def test_one_instance_shared_by_16_threads_counts_every_call(
    client: redis.Redis, namespace: str, registry: CollectorRegistry
) -> None:
    sf = stampede.Stampede(client, namespace=namespace, on_event=Metrics(registry), wait_timeout=30)
    rebuilds = Rebuilds(delay=0.5)
    run_threads(16, lambda: sf.get_or_rebuild(KEY, rebuilds, ttl=60))
    scraped = Scraped(registry)
    sf.close()
    requests = sum(
        scraped("stampede_requests_total", namespace=namespace, result=result)
        for result in ("hit", "stale_hit", "miss", "replica_hit")
    )
    assert requests == 16
    assert rebuilds.count == 1
    assert scraped("stampede_rebuilds_total", namespace=namespace, outcome="ok") == 1
    # Every miss but the leader's waited for it, in this process.
    misses = scraped("stampede_requests_total", namespace=namespace, result="miss")
    assert scraped("stampede_waits_total", namespace=namespace) == misses - 1
    assert scraped("stampede_wait_duration_seconds_count", namespace=namespace) == misses - 1


def test_rebuild_errors_and_redis_errors_are_counted(
    client: redis.Redis, namespace: str, registry: CollectorRegistry
) -> None:
    metrics = Metrics(registry)
    sf = stampede.Stampede(client, namespace=namespace, on_event=metrics)

    def broken() -> str:
        raise RuntimeError("the database went away")

    with pytest.raises(RuntimeError):
        sf.get_or_rebuild(KEY, broken)
    # A Redis failure, as the core reports one (its error's type is the label).
    metrics(Event(EventKind.REDIS_ERROR, KEY, error=redis.ConnectionError("refused"), namespace=namespace))
    scraped = Scraped(registry)
    assert scraped("stampede_rebuilds_total", namespace=namespace, outcome="error") == 1
    assert scraped("stampede_rebuild_duration_seconds_count", namespace=namespace) == 1
    assert (
        scraped(
            "stampede_redis_errors_total", namespace=namespace, error_type="redis.exceptions.ConnectionError"
        )
        == 1
    )
    sf.close()


def test_every_event_kind_is_measured() -> None:
    # A new kind must be given a family (or explicitly none) here, not forgotten.
    assert set(MEASURES) == set(EventKind)


def test_every_kind_reaches_the_registry(registry: CollectorRegistry) -> None:
    metrics = Metrics(registry)
    for kind in EventKind:
        metrics(Event(kind, KEY, duration=0.01, error=ValueError("x"), namespace="ns"))
    scraped = Scraped(registry)
    counted = sum(value for (name, _), value in scraped.samples.items() if name.endswith("_total"))
    assert counted == len(EventKind)
    assert scraped("stampede_commits_not_stored_total", namespace="ns", reason="rejected") == 1
    assert scraped("stampede_commits_not_stored_total", namespace="ns", reason="failed") == 1
    assert scraped("stampede_requests_total", namespace="ns", result="replica_hit") == 1
    assert scraped("stampede_leases_total", namespace="ns", outcome="lost") == 1
    for family in (
        "wait_timeouts",
        "corrupt_entries",
        "fail_opens",
        "no_waits",
        "waits",
    ):
        assert scraped(f"stampede_{family}_total", namespace="ns") == 1, family


def test_metrics_on_one_registry_share_their_collectors(registry: CollectorRegistry) -> None:
    first, second = Metrics(registry), Metrics(registry)
    first(Event(EventKind.HIT, KEY, namespace="ns"))
    second(Event(EventKind.HIT, KEY, namespace="ns"))
    assert Scraped(registry)("stampede_requests_total", namespace="ns", result="hit") == 2


def test_a_registry_with_someone_elses_stampede_family_is_refused(registry: CollectorRegistry) -> None:
    PrometheusCounter("stampede_waits", "someone else's", registry=registry)
    with pytest.raises(ValueError, match="already has a collector of stampede's names"):
        Metrics(registry)
    # Nothing of ours was left registered.
    assert "stampede_requests" not in Scraped(registry).types


def test_the_module_hook_counts_into_the_default_registry(namespace: str) -> None:
    hook = stampede.hook_from("stampede.prometheus.on_event")
    assert hook is stampede.prometheus.on_event
    sf_events = [Event(EventKind.HIT, KEY, namespace=namespace)] * 3
    for event in sf_events:
        hook(event)
    assert (
        REGISTRY.get_sample_value("stampede_requests_total", {"namespace": namespace, "result": "hit"}) == 3
    )
    # A Metrics() made afterwards on the default registry shares its collectors.
    Metrics()(sf_events[0])
    assert (
        REGISTRY.get_sample_value("stampede_requests_total", {"namespace": namespace, "result": "hit"}) == 4
    )


@pytest.mark.parametrize(
    ("module", "dependency", "extra"),
    [
        ("stampede.prometheus", "prometheus_client", "prometheus"),
        ("stampede.opentelemetry", "opentelemetry", "opentelemetry"),
    ],
)
def test_without_the_extra_the_import_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, module: str, dependency: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, dependency, None)  # as if not installed
    monkeypatch.delitem(sys.modules, module)
    monkeypatch.delattr(stampede, module.rsplit(".", 1)[1])
    with pytest.raises(ImportError, match=rf"pip install redis-stampede\[{extra}\]"):
        importlib.import_module(module)
