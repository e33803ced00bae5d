"""stampede.opentelemetry: the spans and metrics of every event, on real Redis."""

from __future__ import annotations

import hashlib
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

import stampede
import stampede.asyncio
import stampede.opentelemetry
from stampede import Event, EventKind
from stampede._core.measures import HISTOGRAMS, MEASURES
from stampede.opentelemetry import Telemetry
from tests.helpers import Rebuilds, wait_until
from tests.observers import Recorder

KEY = "report:daily"


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
