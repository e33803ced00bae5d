"""The algorithm itself, driven by hand: no Redis, no real clock.

Each test scripts what Redis "answers" to the operations the flow yields
and checks the operations it asked for and what the caller gets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any

import pytest

from stampede import EventKind, PickleSerializer, RedisUnavailableError, SerializationError, WaitTimeoutError
from stampede._core.codec import Codec, decode, encode
from stampede._core.envelope import Entry
from stampede._core.flow import Flow
from stampede._core.keys import KeySpace
from stampede._core.memos import BUSY_MEMO_SECONDS, BusyLeases
from stampede._core.ops import (
    Acquire,
    Acquired,
    Capture,
    Commit,
    Lookup,
    Op,
    Rebuild,
    Rebuilt,
    Release,
    Reread,
    Sleep,
    Standby,
    Wait,
    Waited,
)
from stampede._core.options import Options
from stampede._core.tags import Captured
from tests.fakes import FakeClock

SERIALIZER = PickleSerializer()


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


def drive(flow: Generator[Op, Any, Any], answer: Callable[[Op], Any]) -> tuple[Any, list[Op]]:
    """Run ``flow`` to the end; ``answer`` plays Redis (it may raise)."""
    ops: list[Op] = []
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            op = flow.throw(failure) if failure else flow.send(reply)
        except StopIteration as stop:
            return stop.value, ops
        reply, failure = None, None
        if isinstance(op, Capture):
            # Untagged flows, a namespace never invalidated: see
            # test_the_tags_are_captured_after_the_lease_and_before_the_rebuild.
            reply = Captured(0)
            continue
        ops.append(op)
        try:
            reply = answer(op)
        except BaseException as exc:
            failure = exc


def stored(value: Any, clock: FakeClock, *, fresh_for: float) -> bytes:
    now = clock.time()
    return encode(SERIALIZER, value, fresh_until=now + fresh_for, created_at=now, duration=0.2)


def entry(value: Any, clock: FakeClock, *, fresh_for: float) -> Entry:
    return decode(SERIALIZER, stored(value, clock, fresh_for=fresh_for))


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


def kinds(ops: list[Op]) -> list[type]:
    return [type(op) for op in ops]


def test_stale_value_is_served_to_a_caller_that_loses_the_lease() -> None:
    clock, events = FakeClock(), []
    old = entry("old", clock, fresh_for=-5)
    value, ops = drive(make_flow(clock, events).run(Lookup(old)), redis_that(won=False))
    assert value == "old"
    assert kinds(ops) == [Acquire]
    assert EventKind.STALE_HIT in events


def test_a_lease_found_busy_is_not_asked_for_again_for_a_moment() -> None:
    # While another process refreshes a stale key, this process's next
    # callers serve the stale value on one GET, without a lease request each.
    clock, events, busy = FakeClock(), [], BusyLeases()
    old = entry("old", clock, fresh_for=-5)
    value, ops = drive(make_flow(clock, events, busy=busy).run(Lookup(old)), redis_that(won=False))
    assert (value, kinds(ops)) == ("old", [Acquire])
    clock.advance(BUSY_MEMO_SECONDS / 2)
    value, ops = drive(make_flow(clock, events, busy=busy).run(Lookup(old)), redis_that(won=False))
    assert (value, ops) == ("old", [])
    assert events.count(EventKind.STALE_HIT) == 2
    # Another stale value (the refresh landed and went stale again): ask.
    newer = entry("newer", clock, fresh_for=-1)
    value, ops = drive(make_flow(clock, events, busy=busy).run(Lookup(newer)), redis_that(won=False))
    assert (value, kinds(ops)) == ("newer", [Acquire])
    # Not for longer than BUSY_MEMO_SECONDS: a holder that gave up is noticed.
    clock.advance(BUSY_MEMO_SECONDS)
    value, ops = drive(make_flow(clock, events, busy=busy).run(Lookup(newer)), redis_that())
    assert (value, kinds(ops)) == ("new", [Acquire, Rebuild, Commit])
    # Won and written by this process: nothing is remembered.
    value, ops = drive(make_flow(clock, events, busy=busy).run(Lookup(newer)), redis_that())
    assert kinds(ops) == [Acquire, Rebuild, Commit]


def test_lease_winner_rebuilds_and_commits_under_its_token() -> None:
    clock, events = FakeClock(), []
    old = entry("old", clock, fresh_for=-5)
    value, ops = drive(make_flow(clock, events, ttl=60, stale_ttl=30).run(Lookup(old)), redis_that())
    assert value == "new"
    assert kinds(ops) == [Acquire, Rebuild, Commit]
    acquire, rebuild, commit = ops
    assert isinstance(acquire, Acquire)
    assert isinstance(rebuild, Rebuild)
    assert isinstance(commit, Commit)
    assert rebuild.token == acquire.token == commit.token
    assert len(acquire.token) == 32  # 128 random bits in hex
    written = decode(SERIALIZER, commit.data)
    assert written.value == "new"
    assert written.fresh_until == clock.time() + 60
    assert written.duration == pytest.approx(0.1, rel=1e-3)  # stored as a float16


def test_the_tags_are_captured_after_the_lease_and_before_the_rebuild() -> None:
    # Before the rebuild reads its data: an invalidation from then on must
    # leave what it stores stale. The stored value records what was captured.
    clock, events = FakeClock(), []
    flow = make_flow(clock, events)
    flow.tags = (b"post:1", b"user:7")
    steps = flow.run(Lookup(None))
    seen: list[Op] = []
    answers = redis_that()
    reply: Any = None
    captured = Captured(5, ((b"post:1", 11), (b"user:7", 12)))
    while True:
        try:
            op = steps.send(reply)
        except StopIteration:
            break
        seen.append(op)
        reply = captured if isinstance(op, Capture) else answers(op)
    assert kinds(seen) == [Acquire, Capture, Rebuild, Commit]
    assert seen[1] == Capture((b"post:1", b"user:7"))
    commit = seen[3]
    assert isinstance(commit, Commit)
    assert Codec.recorded(commit.data) == (b"", b"post:1", b"user:7")


def test_a_failed_capture_frees_the_lease_and_rebuilds_nothing() -> None:
    clock, events = FakeClock(), []
    answers = redis_that()

    def answer(op: Op) -> Any:
        if isinstance(op, Capture):
            raise RedisUnavailableError("down")
        return answers(op)

    ops: list[Op] = []
    steps = make_flow(clock, events).run(Lookup(None))

    def run() -> None:
        reply: Any = None
        failure: BaseException | None = None
        while True:
            op = steps.throw(failure) if failure else steps.send(reply)
            ops.append(op)
            reply, failure = None, None
            try:
                reply = answer(op)
            except BaseException as exc:
                failure = exc

    with pytest.raises(RedisUnavailableError):
        run()
    assert kinds(ops) == [Acquire, Capture, Release]
    assert isinstance(ops[2], Release)
    assert ops[2].detached


def test_every_acquisition_gets_a_new_token() -> None:
    clock = FakeClock()
    tokens = set()
    for _ in range(50):
        _, ops = drive(make_flow(clock, []).run(Lookup(None)), redis_that())
        tokens.add(ops[0].token)  # type: ignore[union-attr]
    assert len(tokens) == 50


def test_missing_value_waits_for_the_holder_and_returns_what_landed() -> None:
    clock, events = FakeClock(), []
    landed = stored("theirs", clock, fresh_for=60)
    value, ops = drive(make_flow(clock, events).run(Lookup(None)), redis_that(won=False, waited=landed))
    assert value == "theirs"
    assert kinds(ops) == [Acquire, Wait]
    assert ops[1].lease_pttl == 1500  # type: ignore[union-attr]
    assert EventKind.WAIT in events


def test_waiter_takes_over_when_the_lease_is_freed_without_a_value() -> None:
    clock = FakeClock()
    answers = iter([Acquired(False, None, 800), Waited(), Acquired(True, None)])

    def answer(op: Op) -> Any:
        if isinstance(op, Rebuild):
            return Rebuilt("mine", None, 0.1)
        if isinstance(op, Commit):
            return True
        return next(answers)

    value, ops = drive(make_flow(clock, []).run(Lookup(None)), answer)
    assert value == "mine"
    assert kinds(ops) == [Acquire, Wait, Acquire, Rebuild, Commit]


@pytest.mark.parametrize("policy", ["raise", "rebuild"])
def test_wait_timeout_policy(policy: str) -> None:
    clock, events = FakeClock(), []

    def answer(op: Op) -> Any:
        if isinstance(op, Wait):
            clock.advance(op.timeout)  # nobody committed
            return Waited()
        return redis_that(won=False)(op)

    flow = make_flow(clock, events, wait_timeout=3, on_wait_timeout=policy).run(Lookup(None))
    if policy == "raise":
        with pytest.raises(WaitTimeoutError, match="'k'") as caught:
            drive(flow, answer)
        assert caught.value.wait_timeout == 3
        return
    value, ops = drive(flow, answer)
    assert value == "new"
    # Rebuilt for this caller only: nothing fences a write without the lease.
    assert kinds(ops) == [Acquire, Wait, Rebuild]
    assert ops[2].token is None
    assert EventKind.WAIT_TIMEOUT in events


def test_rebuild_error_reaches_the_caller_unchanged_and_frees_the_lease() -> None:
    clock, events = FakeClock(), []
    boom = KeyError("db down")
    with pytest.raises(KeyError) as caught:
        drive(make_flow(clock, events).run(Lookup(None)), redis_that(rebuilt=boom))
    assert caught.value is boom
    assert EventKind.REBUILD_ERROR in events


def test_rebuild_error_releases_before_raising() -> None:
    clock = FakeClock()
    seen: list[Op] = []

    def answer(op: Op) -> Any:
        seen.append(op)
        return redis_that(rebuilt=ValueError("x"))(op)

    with pytest.raises(ValueError, match="x"):
        drive(make_flow(clock, []).run(Lookup(None)), answer)
    assert kinds(seen) == [Acquire, Rebuild, Release]
    assert seen[2].token == seen[0].token  # type: ignore[union-attr]


def test_rebuild_error_with_a_stale_value_serves_it() -> None:
    clock, events = FakeClock(), []
    old = entry("old", clock, fresh_for=-5)
    value, ops = drive(make_flow(clock, events).run(Lookup(old)), redis_that(rebuilt=RuntimeError("x")))
    assert value == "old"
    assert kinds(ops) == [Acquire, Rebuild, Release]


def test_cancelled_rebuild_frees_the_lease_and_is_not_reported_as_an_error() -> None:
    clock, events = FakeClock(), []
    with pytest.raises(asyncio.CancelledError):
        drive(make_flow(clock, events).run(Lookup(None)), redis_that(rebuilt=asyncio.CancelledError()))
    assert EventKind.REBUILD_ERROR not in events


def test_value_that_landed_before_the_lease_is_served_without_rebuilding() -> None:
    clock = FakeClock()
    landed = stored("theirs", clock, fresh_for=60)
    value, ops = drive(make_flow(clock, []).run(Lookup(None)), redis_that(current=landed))
    assert value == "theirs"
    assert kinds(ops) == [Acquire, Release]


def test_stale_refresh_skips_rebuild_when_someone_refreshed_first() -> None:
    clock = FakeClock()
    old = entry("old", clock, fresh_for=-5)
    clock.advance(1)
    newer = stored("newer", clock, fresh_for=60)
    value, ops = drive(make_flow(clock, []).run(Lookup(old)), redis_that(current=newer))
    assert value == "newer"
    assert kinds(ops) == [Acquire, Release]


def test_rejected_commit_still_returns_the_rebuilt_value() -> None:
    clock, events = FakeClock(), []
    value, _ = drive(make_flow(clock, events).run(Lookup(None)), redis_that(committed=False))
    assert value == "new"
    assert EventKind.COMMIT_REJECTED in events


def test_unserializable_value_frees_the_lease_and_names_the_key() -> None:
    clock = FakeClock()
    seen: list[Op] = []

    def answer(op: Op) -> Any:
        seen.append(op)
        return redis_that(rebuilt=lambda: None)(op)  # lambdas do not pickle

    with pytest.raises(SerializationError, match="'k'"):
        drive(make_flow(clock, []).run(Lookup(None)), answer)
    assert kinds(seen) == [Acquire, Rebuild, Release]


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


def test_ttl_none_writes_a_value_that_never_goes_stale() -> None:
    value, ops = drive(make_flow(FakeClock(), [], ttl=None).run(Lookup(None)), redis_that())
    written = decode(SERIALIZER, ops[-1].data)  # type: ignore[union-attr]
    assert written.fresh_until == float("inf")
    assert not written.wants_early_refresh(1e12, beta=100.0)


def test_xfetch_refreshes_early_more_often_near_expiry() -> None:
    clock = FakeClock()
    item = entry("v", clock, fresh_for=10)  # rebuild took 0.2 s

    def rate(seconds_before_expiry: float) -> float:
        now = item.fresh_until - seconds_before_expiry
        return sum(item.wants_early_refresh(now, beta=1.0) for _ in range(4000)) / 4000

    assert rate(5.0) == 0.0  # 25 rebuild durations away: practically never
    assert 0.1 < rate(0.2) < 0.6  # one duration away: e^-1 of the time
    assert rate(0.001) > 0.9
    assert not item.wants_early_refresh(item.fresh_until - 0.001, beta=None)


@pytest.mark.parametrize("failure", [RedisUnavailableError("reply lost"), asyncio.CancelledError()])
def test_an_interrupted_lease_request_drops_the_lease_it_may_have_won(failure: BaseException) -> None:
    seen: list[Op] = []

    def answer(op: Op) -> Any:
        seen.append(op)
        if isinstance(op, Acquire):
            raise failure
        return None

    with pytest.raises(type(failure)):
        drive(make_flow(FakeClock(), []).run(Lookup(None)), answer)
    assert kinds(seen) == [Acquire, Release]
    assert seen[1].token == seen[0].token  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("released", "expected"),
    [(True, [Acquire, Wait, Rebuild]), (False, [Acquire, Wait, Acquire, Rebuild, Commit])],
)
def test_a_reader_goes_on_alone_after_a_release_but_takes_over_after_an_expiry(
    released: bool, expected: list[type]
) -> None:
    # read() hands the rebuild to its caller: after a holder gave its lease up
    # (announced), queueing for the lease again would serialise the callers of
    # a key nobody stores; after a holder died (expiry), someone must take over.
    answers = iter([Acquired(False, None, 800), Waited(None, released), Acquired(True, None)])

    def answer(op: Op) -> Any:
        if isinstance(op, Rebuild):
            return Rebuilt("mine", None, 0.1)
        if isinstance(op, Commit):
            return True
        return next(answers)

    flow = make_flow(FakeClock(), [])
    flow.take_over = False
    _, ops = drive(flow.run(Lookup(None)), answer)
    assert kinds(ops) == expected
