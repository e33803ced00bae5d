"""The algorithm when Redis fails (a failover, a lost reply, a commit that cannot land), driven by
hand: no Redis, no real clock. Each test scripts what Redis "answers" to the operations the flow
yields, its failures included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stampede import EventKind, RedisUnavailableError
from stampede._core.ops import (
    Acquire,
    Acquired,
    Commit,
    Lookup,
    Op,
    Rebuild,
    Rebuilt,
    Release,
    Reread,
    Sleep,
    Standby,
)
from tests.fakes import FakeClock
from tests.machines import drive, entry, kinds, make_flow, redis_that, stored


def unavailable(op: Op) -> Any:
    if isinstance(op, Rebuild):
        return Rebuilt("direct", None, 0.1)
    if isinstance(op, (Release, Standby)):
        return None  # drivers never raise from these; no replica has the key
    raise RedisUnavailableError("connection refused")


def test_redis_down_raises_by_default() -> None:
    with pytest.raises(RedisUnavailableError):
        drive(make_flow(FakeClock(), []).run(Lookup(None)), unavailable)


def test_redis_down_with_fail_open_rebuilds_directly() -> None:
    events: list[EventKind] = []
    value, ops = drive(make_flow(FakeClock(), events, fail_open=True).run(Lookup(None)), unavailable)
    assert value == "direct"
    assert kinds(ops) == [Acquire, Release, Rebuild]
    assert ops[2].token is None  # type: ignore[union-attr]
    assert EventKind.FAIL_OPEN in events


def test_redis_down_on_the_first_read_with_fail_open_rebuilds_directly() -> None:
    lookup = Lookup(None, error=RedisUnavailableError("refused"))
    value, ops = drive(make_flow(FakeClock(), [], fail_open=True).run(lookup), unavailable)
    assert value == "direct"
    assert kinds(ops) == [Standby, Rebuild]


# --- failovers: a replica's copy, or the primary again once promoted -----------


def test_a_failed_first_read_serves_a_replicas_copy_without_a_lease() -> None:
    clock = FakeClock()
    events: list[EventKind] = []
    copy = stored("copy", clock, fresh_for=-5)  # even stale: better than an error
    lookup = Lookup(None, error=RedisUnavailableError("refused"))
    value, ops = drive(make_flow(clock, events).run(lookup), lambda op: copy)
    assert value == "copy"
    assert kinds(ops) == [Standby]
    assert events == [EventKind.REPLICA_HIT]


def test_a_failed_first_read_waits_for_the_promotion_where_the_primary_fails_over() -> None:
    clock = FakeClock()
    fresh = stored("promoted", clock, fresh_for=60)
    failures = [2]

    def answer(op: Op) -> Any:
        if isinstance(op, Sleep):
            clock.advance(op.seconds)
            return None
        if isinstance(op, Standby):
            return None
        assert isinstance(op, Reread)
        if failures[0]:
            failures[0] -= 1
            raise RedisUnavailableError("refused")
        return fresh

    lookup = Lookup(None, error=RedisUnavailableError("refused"))
    value, ops = drive(make_flow(clock, [], fails_over=True).run(lookup), answer)
    assert value == "promoted"
    assert kinds(ops) == [Standby, Sleep, Reread, Sleep, Reread, Sleep, Reread]


def test_a_failed_first_read_raises_where_the_primary_cannot_fail_over() -> None:
    lookup = Lookup(None, error=RedisUnavailableError("refused"))
    with pytest.raises(RedisUnavailableError):
        drive(make_flow(FakeClock(), []).run(lookup), unavailable)


def test_waiting_for_a_promotion_ends_at_wait_timeout() -> None:
    clock = FakeClock()

    def answer(op: Op) -> Any:
        if isinstance(op, Sleep):
            clock.advance(op.seconds)
            return None
        return unavailable(op)

    started = clock.monotonic()
    with pytest.raises(RedisUnavailableError):
        drive(make_flow(clock, [], fails_over=True, wait_timeout=3).run(Lookup(None)), answer)
    assert clock.monotonic() - started <= 3


def test_a_lease_request_during_a_failover_is_tried_again_then_rebuilds_once() -> None:
    clock = FakeClock()
    failures = [3]

    def answer(op: Op) -> Any:
        if isinstance(op, Sleep):
            clock.advance(op.seconds)
            return None
        if isinstance(op, Acquire):
            if failures[0]:
                failures[0] -= 1
                raise RedisUnavailableError("MASTERDOWN")
            return Acquired(True, None)
        if isinstance(op, Rebuild):
            return Rebuilt("v", None, 0.1)
        if isinstance(op, Commit):
            return True
        return None

    value, ops = drive(make_flow(clock, [], fails_over=True).run(Lookup(None)), answer)
    assert value == "v"
    assert kinds(ops).count(Rebuild) == 1
    assert kinds(ops).count(Acquire) == 4


def test_redis_down_with_a_stale_value_in_hand_serves_it() -> None:
    clock = FakeClock()
    old = entry("old", clock, fresh_for=-5)
    value, ops = drive(make_flow(clock, []).run(Lookup(old)), unavailable)
    assert value == "old"
    assert kinds(ops) == [Acquire, Release]


def commit_fails(clock: FakeClock, times: int = 1_000_000) -> Callable[[Op], Any]:
    """Redis where the first ``times`` commits fail; sleeping moves the clock."""
    failures = [times]

    def answer(op: Op) -> Any:
        if isinstance(op, Sleep):
            clock.advance(op.seconds)
            return None
        if isinstance(op, Commit) and failures[0] > 0:
            failures[0] -= 1
            raise RedisUnavailableError("gone")
        return redis_that()(op)

    return answer


def test_a_failed_commit_is_retried_within_the_lease_and_lands() -> None:
    clock, events = FakeClock(), []
    value, ops = drive(make_flow(clock, events).run(Lookup(None)), commit_fails(clock, times=2))
    assert value == "new"
    assert kinds(ops) == [Acquire, Rebuild, Commit, Sleep, Commit, Sleep, Commit]
    assert EventKind.COMMIT_FAILED not in events


def test_a_commit_that_cannot_land_frees_the_lease_in_the_background_and_serves_nothing_unstored() -> None:
    clock, events = FakeClock(), []
    flow = make_flow(clock, events, lease_ttl=2)
    with pytest.raises(RedisUnavailableError):
        drive(flow.run(Lookup(None)), commit_fails(clock))
    assert EventKind.COMMIT_FAILED in events
    assert flow.committed is False


def test_a_commit_that_cannot_land_serves_the_stale_value_or_with_fail_open_the_rebuilt_one() -> None:
    clock = FakeClock()
    old = entry("old", clock, fresh_for=-5)
    value, ops = drive(make_flow(clock, [], lease_ttl=2).run(Lookup(old)), commit_fails(clock))
    assert value == "old"
    # The waiters are told to compete for the lease: a value was rebuilt (it
    # could not be stored), so they do not each go on alone.
    assert ops[-1] == Release(ops[0].token, detached=True, retake=True)  # type: ignore[union-attr]
    value, _ = drive(make_flow(clock, [], lease_ttl=2, fail_open=True).run(Lookup(None)), commit_fails(clock))
    assert value == "new"


def test_a_failed_lease_request_is_released_in_the_background() -> None:
    def answer(op: Op) -> Any:
        if isinstance(op, Acquire):
            raise RedisUnavailableError("no reply")
        return redis_that()(op)

    clock = FakeClock()
    with pytest.raises(RedisUnavailableError):
        drive(make_flow(clock, []).run(Lookup(None)), answer)
    # One wait on a stalled Redis, not two: the release does not block the caller.
    _, ops = drive(make_flow(clock, [], fail_open=True).run(Lookup(None)), answer)
    assert [op for op in ops if isinstance(op, Release)] == [Release(ops[0].token, detached=True)]  # type: ignore[union-attr]
