"""``get_or_rebuild_many`` decided by the core alone (``stampede._core.batch``):
which keys are served, rebuilt, waited for, and what the caller is given when
Redis or the rebuild fails; driven by hand, with no Redis."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from stampede import ConfigurationError, RedisUnavailableError
from stampede._core.batch import ABSENT, get_or_rebuild_many
from stampede._core.calls import Calls
from stampede._core.ops import (
    Acquire,
    Acquired,
    AcquireMany,
    Capture,
    CommitMany,
    FirstRead,
    Lookup,
    OfKey,
    Op,
    ReadMany,
    ReadTags,
    Rebuild,
    RebuildMany,
    Rebuilt,
    Refused,
    ReleaseMany,
    Wait,
    Waited,
)
from stampede._core.tags import Captured
from tests.fakes import FakeClock
from tests.machines import calls_with, kinds, stored
from tests.machines import drive as drive_all


def drive(steps: Any, answer: Any) -> tuple[Any, list[Op]]:
    """:func:`tests.machines.drive`, without the reads of the namespace's state
    (the values here record it, as every value does)."""
    found, ops = drive_all(steps, answer)
    return found, [op for op in ops if not isinstance(op, ReadTags)]


def batch(calls: Calls, *keys: str) -> Any:
    return get_or_rebuild_many(calls, calls.settings.many(keys), calls.settings.options, (), can_wait=True)


def redis(
    clock: FakeClock,
    *,
    held: Mapping[str, bytes] | None = None,
    won: set[str] | None = None,
    rebuilt: Any = None,
    commit: Any = True,
) -> Any:
    """Redis holding ``held`` (name -> raw), granting the leases of ``won``
    (all when ``None``); the batch function returning ``rebuilt``."""
    held = held or {}

    def answer(op: Op) -> Any:
        if isinstance(op, ReadMany):
            return [held.get(keys.name) for keys in op.names]
        if isinstance(op, AcquireMany):
            return [
                Acquired(True, None, won_at="1")
                if won is None or keys.name in won
                else Acquired(False, None, 900)
                for keys, _ in op.asks
            ]
        if isinstance(op, RebuildMany):
            if isinstance(rebuilt, BaseException):
                return Rebuilt(None, rebuilt, 0.1)
            value = rebuilt if rebuilt is not None else {key: f"{key}!" for key in op.keys}
            return Rebuilt(value, None, 0.1)
        if isinstance(op, CommitMany):
            if isinstance(commit, BaseException):
                raise commit
            return [commit for _ in op.commits]
        if isinstance(op, ReleaseMany):
            return True
        if isinstance(op, ReadTags):
            return True  # the namespace's state: never invalidated
        if isinstance(op, Capture):
            return Captured(0)
        raise AssertionError(f"unexpected {op!r}")

    return answer


def test_fresh_keys_are_served_and_the_others_rebuilt_in_one_call_and_one_commit() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    held = {"a": stored("A", clock, fresh_for=60)}
    found, ops = drive(batch(calls, "a", "b", "c"), redis(clock, held=held))
    assert found == {"a": "A", "b": "b!", "c": "c!"}
    assert kinds(ops) == [ReadMany, AcquireMany, RebuildMany, CommitMany]
    rebuild = ops[2]
    assert isinstance(rebuild, RebuildMany)
    assert rebuild.keys == ("b", "c")
    assert [keys.name for keys, _ in rebuild.leases] == ["b", "c"]


def test_stale_keys_another_caller_refreshes_are_served_stale() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    held = {"a": stored("old", clock, fresh_for=-5)}
    found, ops = drive(batch(calls, "a"), redis(clock, held=held, won=set()))
    assert found == {"a": "old"}
    assert kinds(ops) == [ReadMany, AcquireMany]


def test_a_missing_key_another_caller_rebuilds_is_waited_for_by_its_own_machine() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    base = redis(clock, won=set())
    landed = stored("theirs", clock, fresh_for=60)

    def answer(op: Op) -> Any:
        if isinstance(op, OfKey):
            assert op.keys.name == "a"
            inner = op.op
            if isinstance(inner, FirstRead):
                return Lookup(None)
            if isinstance(inner, Acquire):
                return Acquired(False, None, 900)
            if isinstance(inner, Wait):
                return Waited(landed)
            if isinstance(inner, ReadTags):  # what landed is judged by states read lately
                return True
            raise AssertionError(f"unexpected {inner!r}")
        return base(op)

    found, ops = drive(batch(calls, "a"), answer)
    assert found == {"a": "theirs"}
    assert [type(op.op) for op in ops if isinstance(op, OfKey)] == [FirstRead, Acquire, Wait, ReadTags]


def test_a_key_rebuilt_alone_that_the_batch_function_leaves_out_is_left_out() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    base = redis(clock, won=set())

    def answer(op: Op) -> Any:
        if isinstance(op, OfKey):
            inner = op.op
            if isinstance(inner, FirstRead):
                return Lookup(None)
            if isinstance(inner, Acquire):
                return Acquired(True, None, won_at="1")
            if isinstance(inner, Rebuild):
                from stampede._core.batch import Absent

                return Rebuilt(None, Absent(op.key), 0.1)
            return None  # the release
        return base(op)

    found, _ = drive(batch(calls, "a"), answer)
    assert found == {}
    assert ABSENT not in found.values()


def test_redis_failing_the_lease_request_serves_what_is_in_hand_and_raises_without_fail_open() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    held = {"a": stored("old", clock, fresh_for=-5)}
    base = redis(clock, held=held)

    def failing(op: Op) -> Any:
        if isinstance(op, AcquireMany):
            raise RedisUnavailableError("down")
        return base(op)

    found, ops = drive(batch(calls, "a"), failing)
    assert found == {"a": "old"}
    assert ops[-1] == ReleaseMany(ops[1].asks, detached=True)  # type: ignore[union-attr]
    with pytest.raises(RedisUnavailableError):
        drive(batch(calls, "a", "b"), failing)  # b has nothing in hand


def test_with_fail_open_the_keys_with_nothing_in_hand_are_rebuilt_without_redis() -> None:
    clock = FakeClock()
    calls = calls_with(clock, fail_open=True)
    base = redis(clock)

    def failing(op: Op) -> Any:
        if isinstance(op, ReadMany):
            raise RedisUnavailableError("down")
        return base(op)

    found, ops = drive(batch(calls, "a", "b"), failing)
    assert found == {"a": "a!", "b": "b!"}
    assert kinds(ops) == [ReadMany, RebuildMany]
    assert ops[1] == RebuildMany(("a", "b"), ())  # no lease: stored nowhere


def test_a_batch_function_that_raises_serves_the_stale_values_only_if_every_key_has_one() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    old = {"a": stored("A0", clock, fresh_for=-5), "b": stored("B0", clock, fresh_for=-5)}
    found, ops = drive(batch(calls, "a", "b"), redis(clock, held=old, rebuilt=ValueError("db down")))
    assert found == {"a": "A0", "b": "B0"}
    assert kinds(ops)[-1] is ReleaseMany
    with pytest.raises(ValueError, match="db down"):
        drive(batch(calls, "a", "c"), redis(clock, held=old, rebuilt=ValueError("db down")))


def test_a_batch_function_that_returns_no_mapping_is_a_configuration_error() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    with pytest.raises(ConfigurationError, match="rebuild_many must return a mapping"):
        drive(batch(calls, "a"), redis(clock, rebuilt=["not", "a", "mapping"]))


def test_a_commit_that_cannot_land_serves_stale_values_or_with_fail_open_the_rebuilt_ones() -> None:
    clock = FakeClock()
    old = {"a": stored("A0", clock, fresh_for=-5)}
    found, _ = drive(batch(calls_with(clock), "a"), redis(clock, held=old, commit=RedisUnavailableError("x")))
    assert found == {"a": "A0"}
    with pytest.raises(RedisUnavailableError):
        drive(batch(calls_with(clock), "b"), redis(clock, commit=RedisUnavailableError("x")))
    found, _ = drive(
        batch(calls_with(clock, fail_open=True), "b"), redis(clock, commit=RedisUnavailableError("x"))
    )
    assert found == {"b": "b!"}


def test_a_refused_commit_serves_what_the_newer_write_left() -> None:
    clock = FakeClock()
    newer = stored("newer", clock, fresh_for=60)
    found, _ = drive(batch(calls_with(clock), "a", "b"), redis(clock, commit=Refused(newer)))
    assert found == {"a": "newer", "b": "newer"}
    found, _ = drive(batch(calls_with(clock), "a"), redis(clock, commit=Refused(None)))
    assert found == {"a": "a!"}  # nothing readable left: its own value


def test_callers_asking_for_the_same_batch_share_it() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    first = batch(calls, "a", "b")
    assert isinstance(first.send(None), ReadMany)
    second = batch(calls, "a", "b")
    waiting = second.send(None)
    assert type(waiting).__name__ == "AwaitFlight"
    found, _ = drive(_resumed(first, [None, None]), redis(clock))
    assert found == {"a": "a!", "b": "b!"}
    with pytest.raises(StopIteration) as stop:
        second.send(True)
    assert stop.value.value == {"a": "a!", "b": "b!"}


def test_a_caller_that_asks_once_the_shared_batch_has_read_shares_the_next_one() -> None:
    # What the leader read may predate a write that returned before this
    # caller came (another process's delete): it reads for itself.
    clock = FakeClock()
    calls = calls_with(clock)
    first = batch(calls, "a", "b")
    assert isinstance(first.send(None), ReadMany)
    clock.advance(0.01)
    second = batch(calls, "a", "b")
    assert type(second.send(None)).__name__ == "AwaitFlight"
    found, _ = drive(_resumed(first, [None, None]), redis(clock))
    assert found == {"a": "a!", "b": "b!"}
    assert isinstance(second.send(True), ReadMany)  # its own batch, not the outcome


def _resumed(steps: Any, reply: Any) -> Any:
    """``steps``, already started, resumed with ``reply``: as a machine to drive."""
    try:
        op = steps.send(reply)
        while True:
            op = steps.send((yield op))
    except StopIteration as stop:
        return stop.value
