"""Metrics and tracing hooks: stampede.prometheus, stampede.opentelemetry and
stampede.hook_from, on real Redis."""

from __future__ import annotations

import hashlib
import importlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client import Counter as PrometheusCounter
from prometheus_client.parser import text_string_to_metric_families

import stampede
import stampede.asyncio
import stampede.opentelemetry
import stampede.prometheus
from stampede import Event, EventKind
from stampede._core.measures import HISTOGRAMS, MEASURES
from stampede.opentelemetry import Telemetry
from stampede.prometheus import Metrics
from tests.helpers import Rebuilds, run_threads, wait_until

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


class Recorder:
    """A hook that keeps every event, for counting them."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def count(self, kind: EventKind) -> int:
        with self._lock:
            return sum(event.kind is kind for event in self.events)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


# --- Prometheus --------------------------------------------------------------------


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


# --- hook_from ------------------------------------------------------------------------


def record_here(event: Event) -> None:
    """A hook named by its dotted path in the tests below."""
    RECORDED.append(event)


RECORDED: list[Event] = []


def test_hooks_are_all_called_in_order_though_one_raises(
    client: redis.Redis, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    def first(event: Event) -> None:
        calls.append("first")

    def broken(event: Event) -> None:
        calls.append("broken")
        raise RuntimeError("a broken observer")

    RECORDED.clear()
    hook = stampede.hook_from([first, broken, "tests.test_observability.record_here"])
    sf = stampede.Stampede(client, namespace=namespace, on_event=hook)
    with caplog.at_level(logging.ERROR, logger="stampede"):
        assert sf.get_or_rebuild(KEY, lambda: "v", ttl=60) == "v"
    kinds = [event.kind for event in RECORDED]
    assert kinds == [EventKind.MISS, EventKind.LEASE_WON, EventKind.REBUILD]
    assert calls == ["first", "broken"] * 3
    assert "a broken observer" in caplog.text
    sf.close()


def test_hook_from_settings() -> None:
    assert stampede.hook_from(None) is None
    assert stampede.hook_from([]) is None
    assert stampede.hook_from([print]) is print
    assert stampede.hook_from("tests.test_observability.record_here") is record_here
    # Read twice, a setting gives equal hooks (Django compares its configurations).
    assert stampede.hook_from([print, "tests.test_observability.record_here"]) == stampede.hook_from(
        (print, record_here)
    )
    assert hash(stampede.hook_from([print, record_here])) == hash(stampede.hook_from([print, record_here]))


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (42, r"^ON_EVENT must be a callable, its dotted path, or a list of them, got 42$"),
        ("nope.missing", r"^ON_EVENT 'nope.missing' cannot be imported: No module named 'nope'"),
        ([print, "stampede.nothing"], r"^ON_EVENT\[1\] 'stampede.nothing' cannot be imported"),
        ([print, 42], r"^ON_EVENT\[1\] must be a callable or its dotted path, got 42$"),
        ("stampede.prometheus.Metrics", r"^ON_EVENT names the class Metrics: give an instance"),
    ],
)
def test_hook_from_names_the_setting(setting: Any, message: str) -> None:
    with pytest.raises(stampede.ConfigurationError, match=message):
        stampede.hook_from(setting, "ON_EVENT")


# --- OpenTelemetry ------------------------------------------------------------------


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def reader() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    metric_reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[metric_reader])
    yield provider, metric_reader
    provider.shutdown()


def _points(metric_reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = metric_reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: list(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


def _sum(points: list[Any], **attributes: str) -> float:
    total = 0.0
    for point in points:
        assert isinstance(point, NumberDataPoint)
        found = point.attributes or {}
        if all(found.get(name) == value for name, value in attributes.items()):
            total += point.value
    return total


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_rebuild_and_wait_spans_are_children_of_the_callers_spans(
    client: redis.Redis,
    namespace: str,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    reader: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    tracer_provider, exporter = spans
    meter_provider, metric_reader = reader
    seen = Recorder()
    hook = stampede.hook_from([Telemetry(tracer_provider, meter_provider), seen])
    tracer = tracer_provider.get_tracer("the app")
    holder = stampede.Stampede(client, namespace=namespace, on_event=hook, wait_timeout=30)
    waiter = stampede.Stampede(client, namespace=namespace, on_event=hook, wait_timeout=30)

    def rebuild() -> str:
        wait_until(lambda: seen.count(EventKind.LEASE_BUSY) == 1, timeout=30)
        return "v1"

    def request(sf: stampede.Stampede, name: str) -> Any:
        with tracer.start_as_current_span(name):
            return sf.get_or_rebuild(KEY, rebuild, ttl=60)

    rebuilt = threading.Thread(target=request, args=(holder, "holder request"))
    rebuilt.start()
    wait_until(lambda: seen.count(EventKind.LEASE_WON) == 1)
    assert request(waiter, "waiter request") == "v1"
    rebuilt.join(30)

    (holder_span,) = _named(exporter, "holder request")
    (waiter_span,) = _named(exporter, "waiter request")
    (rebuild_span,) = _named(exporter, "stampede.rebuild")
    (wait_span,) = _named(exporter, "stampede.wait")
    assert rebuild_span.parent is not None
    assert rebuild_span.parent.span_id == holder_span.context.span_id
    assert wait_span.parent is not None
    assert wait_span.parent.span_id == waiter_span.context.span_id
    (rebuild_event,) = [event for event in seen.events if event.kind is EventKind.REBUILD]
    (wait_event,) = [event for event in seen.events if event.kind is EventKind.WAIT]
    assert rebuild_event.duration is not None
    assert wait_event.duration is not None
    assert rebuild_span.end_time is not None
    assert rebuild_span.start_time is not None
    assert rebuild_span.end_time - rebuild_span.start_time == int(rebuild_event.duration * 1e9)
    assert wait_span.end_time is not None
    assert wait_span.start_time is not None
    assert wait_span.end_time - wait_span.start_time == int(wait_event.duration * 1e9)
    digest = hashlib.sha256(KEY.encode()).hexdigest()[:16]
    assert dict(rebuild_span.attributes or {}) == {
        "stampede.namespace": namespace,
        "stampede.outcome": "ok",
        "stampede.key.sha256": digest,
    }
    assert dict(wait_span.attributes or {}) == {
        "stampede.namespace": namespace,
        "stampede.key.sha256": digest,
    }
    assert rebuild_span.status.status_code is StatusCode.UNSET

    points = _points(metric_reader)
    assert (
        _sum(points["stampede_requests"], **{"stampede.namespace": namespace, "stampede.result": "miss"}) == 2
    )
    assert _sum(points["stampede_leases"], **{"stampede.outcome": "won"}) == 1
    assert _sum(points["stampede_leases"], **{"stampede.outcome": "busy"}) == 1
    assert _sum(points["stampede_rebuilds"], **{"stampede.outcome": "ok"}) == 1
    assert _sum(points["stampede_waits"]) == 1
    (rebuild_times,) = points["stampede_rebuild_duration_seconds"]
    assert isinstance(rebuild_times, HistogramDataPoint)
    assert rebuild_times.count == 1
    histogram = MEASURES[EventKind.REBUILD].histogram
    assert histogram is not None
    assert list(rebuild_times.explicit_bounds) == [float(bound) for bound in HISTOGRAMS[histogram]]
    holder.close()
    waiter.close()


def test_a_failed_rebuild_is_an_error_span(
    client: redis.Redis, namespace: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    tracer_provider, exporter = spans
    sf = stampede.Stampede(
        client,
        namespace=namespace,
        on_event=Telemetry(tracer_provider, otel_metrics.NoOpMeterProvider(), key_hash=False),
    )

    def broken() -> str:
        raise RuntimeError("the database went away")

    with pytest.raises(RuntimeError):
        sf.get_or_rebuild(KEY, broken)
    (span,) = _named(exporter, "stampede.rebuild")
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "RuntimeError: the database went away"
    assert dict(span.attributes or {}) == {
        "stampede.namespace": namespace,
        "stampede.outcome": "error",
        "error.type": "RuntimeError",
    }
    (exception,) = [event for event in span.events if event.name == "exception"]
    assert (exception.attributes or {})["exception.type"] == "RuntimeError"
    sf.close()


def test_a_wait_timeout_is_an_event_of_the_callers_span(
    client: redis.Redis, namespace: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    tracer_provider, exporter = spans
    hook = Telemetry(tracer_provider, otel_metrics.NoOpMeterProvider())
    holder = stampede.Stampede(client, namespace=namespace)
    waiter = stampede.Stampede(
        client, namespace=namespace, on_event=hook, wait_timeout=0.2, on_wait_timeout="raise"
    )
    read = holder.read(KEY)
    assert read.lease is not None  # held by another "process" while the waiter gives up
    with (
        tracer_provider.get_tracer("the app").start_as_current_span("request"),
        pytest.raises(stampede.WaitTimeoutError),
    ):
        waiter.get_or_rebuild(KEY, Rebuilds())
    holder.release(read.lease)
    (request,) = _named(exporter, "request")
    assert [event.name for event in request.events] == ["stampede.wait_timeout"]
    assert (request.events[0].attributes or {})["stampede.namespace"] == namespace
    assert len(_named(exporter, "stampede.wait")) == 1
    holder.close()
    waiter.close()


async def test_asyncio_spans_are_children_of_the_tasks_span(
    redis_url: str, namespace: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    tracer_provider, exporter = spans
    client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
    sf = stampede.asyncio.Stampede(
        client, namespace=namespace, on_event=Telemetry(tracer_provider, otel_metrics.NoOpMeterProvider())
    )

    async def rebuild() -> str:
        return "v1"

    with tracer_provider.get_tracer("the app").start_as_current_span("task"):
        value: str = await sf.get_or_rebuild(KEY, rebuild, ttl=60)
    assert value == "v1"
    (task,) = _named(exporter, "task")
    (rebuild_span,) = _named(exporter, "stampede.rebuild")
    assert rebuild_span.parent is not None
    assert rebuild_span.parent.span_id == task.context.span_id
    await sf.aclose()
    await client.aclose()


def test_without_an_sdk_spans_cost_nothing_more(monkeypatch: pytest.MonkeyPatch) -> None:
    # The API's no-op providers (what the global ones are until an SDK is
    # set): spans are not recording, so nothing is done for them, not even
    # the key's hash.
    def never(key: str) -> str:
        raise AssertionError("work done for a span nobody records")

    monkeypatch.setattr(stampede.opentelemetry, "_key_hash", never)
    hook = Telemetry(trace.NoOpTracerProvider(), otel_metrics.NoOpMeterProvider())
    for kind in EventKind:
        hook(Event(kind, KEY, duration=0.5, error=RuntimeError("x"), namespace="ns"))
    sampled_out = Telemetry(TracerProvider(sampler=ALWAYS_OFF), otel_metrics.NoOpMeterProvider())
    sampled_out(Event(EventKind.REBUILD, KEY, duration=0.5, namespace="ns"))


def test_every_kind_reaches_the_meter(reader: tuple[MeterProvider, InMemoryMetricReader]) -> None:
    meter_provider, metric_reader = reader
    hook = Telemetry(trace.NoOpTracerProvider(), meter_provider)
    for kind in EventKind:
        hook(Event(kind, KEY, duration=0.5, error=RuntimeError("x"), namespace="ns"))
    points = _points(metric_reader)
    counters = {name: points[name] for name in points if not name.endswith("_seconds")}
    assert set(counters) == {measure.family.name for measure in MEASURES.values()}
    assert sum(_sum(found) for found in counters.values()) == len(EventKind)
    assert _sum(points["stampede_redis_errors"], **{"error.type": "RuntimeError"}) == 1
    (rebuilds,) = points["stampede_rebuild_duration_seconds"]
    (waits,) = points["stampede_wait_duration_seconds"]
    assert isinstance(rebuilds, HistogramDataPoint)
    assert isinstance(waits, HistogramDataPoint)
    assert (rebuilds.count, rebuilds.sum, waits.count) == (2, 1.0, 1)  # rebuild, rebuild_error; wait
