"""The algorithm itself, driven by hand: no Redis, no real clock.

Each test scripts what Redis "answers" to the operations the flow yields
and checks the operations it asked for and what the caller gets.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stampede import EventKind, RedisUnavailableError, SerializationError, WaitTimeoutError
from stampede._core.codec import Codec, decode
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
    Wait,
    Waited,
)
from stampede._core.tags import Captured
from tests.fakes import FakeClock
from tests.machines import SERIALIZER, drive, entry, kinds, make_flow, redis_that, stored


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
