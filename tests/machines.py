"""Driving the core's machines by hand, as the drivers do but with no Redis:
a test plays Redis (and the caller's rebuild) by answering each operation."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import Any

from stampede import EventKind, PickleSerializer
from stampede._core.calls import Calls
from stampede._core.codec import Codec, decode, encode
from stampede._core.envelope import Entry
from stampede._core.flow import Flow
from stampede._core.keys import KeySpace
from stampede._core.memos import BusyLeases
from stampede._core.ops import Acquire, Acquired, Capture, Commit, Op, Rebuild, Rebuilt, Wait, Waited
from stampede._core.options import Options
from stampede._core.settings import Settings
from stampede._core.tags import Captured
from tests.fakes import FakeClock

SERIALIZER = PickleSerializer()


def drive(steps: Generator[Op, Any, Any], answer: Callable[[Op], Any]) -> tuple[Any, list[Op]]:
    """Run ``steps`` to the end; ``answer`` plays Redis (it may raise).
    Returns the result and the operations asked for (captures of the tags
    excepted: untagged, a namespace never invalidated)."""
    ops: list[Op] = []
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            op = steps.throw(failure) if failure else steps.send(reply)
        except StopIteration as stop:
            return stop.value, ops
        reply, failure = None, None
        if isinstance(op, Capture):
            reply = Captured(0)
            continue
        ops.append(op)
        try:
            reply = answer(op)
        except BaseException as exc:
            failure = exc


def stored(value: Any, clock: FakeClock, *, fresh_for: float) -> bytes:
    """A value as Redis would hold it, fresh for ``fresh_for`` seconds from now."""
    now = clock.time()
    return encode(SERIALIZER, value, fresh_until=now + fresh_for, created_at=now, duration=0.2)


def entry(value: Any, clock: FakeClock, *, fresh_for: float) -> Entry:
    return decode(SERIALIZER, stored(value, clock, fresh_for=fresh_for))


def kinds(ops: list[Op]) -> list[type]:
    return [type(op) for op in ops]


def calls_with(clock: FakeClock, events: list[Any] | None = None, **options: Any) -> Calls:
    """The machines of an instance of namespace ``ns`` on ``clock``; its
    events go to ``events``."""
    hook = events.append if events is not None else None
    settings = Settings(
        namespace="ns", clock=clock, on_event=hook, option_values=options, compress_above=None
    )
    return Calls(settings, threading.Event, fails_over=False)


def make_flow(
    clock: FakeClock,
    events: list[EventKind],
    *,
    fails_over: bool = False,
    busy: BusyLeases | None = None,
    **options: Any,
) -> Flow:
    keys = KeySpace("ns")("k")

    def decode_or_none(raw: bytes | None) -> Entry | None:
        return None if raw is None else decode(SERIALIZER, raw)

    return Flow(
        keys,
        Options(**options),
        Codec(SERIALIZER),
        decode_or_none,
        clock,
        lambda kind, **_: events.append(kind),
        fails_over=fails_over,
        busy=busy,
    )


def redis_that(
    *,
    won: bool = True,
    current: bytes | None = None,
    rebuilt: Any = "new",
    committed: bool = True,
    waited: bytes | None = None,
) -> Callable[[Op], Any]:
    def answer(op: Op) -> Any:
        if isinstance(op, Acquire):
            return Acquired(won, current, 1500)
        if isinstance(op, Rebuild):
            if isinstance(rebuilt, BaseException):
                return Rebuilt(None, rebuilt, 0.1)
            return Rebuilt(rebuilt, None, 0.1)
        if isinstance(op, Commit):
            return committed
        if isinstance(op, Wait):
            return Waited(waited)
        return None

    return answer
