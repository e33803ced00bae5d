"""What a caller is given when something fails (``stampede._core.policy``): each
rule on its own, as every machine (one key, a batch, plain reads) applies it."""

from __future__ import annotations

from typing import Any

import pytest

from stampede import EventKind, Options, RedisUnavailableError, WaitTimeoutError
from stampede._core import policy
from stampede._core.ops import Commit, Refused, Reread, Sleep
from tests.fakes import FakeClock
from tests.machines import drive, entry


def events_into(kinds: list[EventKind]) -> Any:
    return lambda kind, **_: kinds.append(kind)


def test_a_redis_failure_serves_the_stale_value_in_hand_first() -> None:
    emitted: list[EventKind] = []
    error = RedisUnavailableError("down")
    for fail_open in (False, True):
        fallback = policy.on_redis_failure(
            "k", error, stale=True, options=Options(fail_open=fail_open), emit=events_into(emitted)
        )
        assert fallback is policy.Fallback.STALE
    assert emitted == []


def test_a_redis_failure_with_nothing_in_hand_raises_unless_fail_open() -> None:
    emitted: list[EventKind] = []
    error = RedisUnavailableError("down")
    with pytest.raises(RedisUnavailableError):
        policy.on_redis_failure("k", error, stale=False, options=Options(), emit=events_into(emitted))
    fallback = policy.on_redis_failure(
        "k", error, stale=False, options=Options(fail_open=True), emit=events_into(emitted)
    )
    assert fallback is policy.Fallback.ALONE
    assert emitted == [EventKind.FAIL_OPEN]


def test_a_rebuild_error_serves_the_stale_value_but_never_hides_a_cancellation() -> None:
    assert policy.on_rebuild_error("k", ValueError("db"), stale=True) is True
    assert policy.on_rebuild_error("k", ValueError("db"), stale=False) is False
    assert policy.on_rebuild_error("k", KeyboardInterrupt(), stale=True) is False


def test_a_value_that_cannot_be_stored_is_served_only_under_fail_open() -> None:
    error = RedisUnavailableError("down")
    assert policy.on_store_failure("k", error, stale=True, options=Options()) is policy.Fallback.STALE
    with pytest.raises(RedisUnavailableError):
        policy.on_store_failure("k", error, stale=False, options=Options())
    assert (
        policy.on_store_failure("k", error, stale=False, options=Options(fail_open=True))
        is policy.Fallback.ALONE
    )


def test_a_refused_commit_serves_what_the_newer_write_left_even_stale() -> None:
    clock = FakeClock()
    emitted: list[EventKind] = []
    newer = entry("newer", clock, fresh_for=-1)
    assert policy.on_refused_commit("k", "mine", newer, events_into(emitted)) == "newer"
    assert policy.on_refused_commit("k", "mine", None, events_into(emitted)) == "mine"
    assert emitted == [EventKind.COMMIT_REJECTED] * 2


def test_the_wait_timeout_policy_raises_or_lets_the_caller_go_on() -> None:
    emitted: list[EventKind] = []
    with pytest.raises(WaitTimeoutError):
        policy.on_wait_timeout("k", Options(on_wait_timeout="raise"), events_into(emitted))
    policy.on_wait_timeout("k", Options(on_wait_timeout="rebuild"), events_into(emitted))  # goes on
    assert emitted == [EventKind.WAIT_TIMEOUT] * 2


def test_a_failed_commit_is_tried_again_with_backoff_within_the_lease() -> None:
    clock = FakeClock()
    commit = Commit("t", b"data")
    options = Options(lease_ttl=1)
    failures = iter([RedisUnavailableError("a"), RedisUnavailableError("b")])

    def answer(op: Any) -> Any:
        if isinstance(op, Sleep):
            clock.advance(op.seconds)
            return None
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return Refused(None)

    outcome, ops = drive(policy.committed(commit, options, clock), answer)
    assert outcome == Refused(None)
    assert ops == [commit, Sleep(0.05), commit, Sleep(0.1), commit]


def test_a_commit_failing_for_the_whole_lease_raises_the_last_failure() -> None:
    clock = FakeClock()

    def answer(op: Any) -> Any:
        if isinstance(op, Sleep):
            clock.advance(op.seconds)
            return None
        raise RedisUnavailableError("still down")

    with pytest.raises(RedisUnavailableError, match="still down"):
        drive(policy.committed(Commit("t", b""), Options(lease_ttl=1), clock), answer)
    assert clock.monotonic() < 1


@pytest.mark.parametrize(("fails_over", "fail_open"), [(False, False), (True, True)])
def test_a_primary_that_cannot_fail_over_or_under_fail_open_is_not_tried_again(
    fails_over: bool, fail_open: bool
) -> None:
    clock = FakeClock()
    failover = policy.Failover(fails_over, Options(fail_open=fail_open), clock, deadline=5.0)
    with pytest.raises(RedisUnavailableError, match="first"):
        drive(failover.until_primary(Reread(), RedisUnavailableError("first")), lambda op: None)


def test_a_primary_failing_over_is_tried_again_with_backoff_until_it_answers_or_time_is_up() -> None:
    clock = FakeClock()
    failover = policy.Failover(True, Options(), clock, deadline=1.0)
    tries = iter([RedisUnavailableError("again"), b"raw"])

    def answer(op: Any) -> Any:
        if isinstance(op, Sleep):
            clock.advance(op.seconds)
            return None
        outcome = next(tries)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    raw, ops = drive(failover.until_primary(Reread(), RedisUnavailableError("first")), answer)
    assert raw == b"raw"
    assert ops == [Sleep(0.05), Reread(), Sleep(0.1), Reread()]

    def down(op: Any) -> Any:
        if isinstance(op, Sleep):
            clock.advance(op.seconds)
            return None
        raise RedisUnavailableError("down")

    with pytest.raises(RedisUnavailableError, match="down"):
        drive(failover.until_primary(Reread(), RedisUnavailableError("first")), down)
    assert clock.monotonic() <= 1.0 + policy.FAILOVER_BACKOFF


def test_a_write_refused_by_a_redis_that_is_up_never_fails_a_read() -> None:
    for code in policy.REFUSED_WRITES:
        error = RedisUnavailableError("refused", code=code)
        emitted: list[EventKind] = []
        fallback = policy.on_redis_failure(
            "k", error, stale=False, options=Options(), emit=events_into(emitted)
        )
        assert fallback is policy.Fallback.ALONE
        assert policy.on_store_failure("k", error, stale=False, options=Options()) is policy.Fallback.ALONE
        assert policy.skips_retries(error, Options())
    down = RedisUnavailableError("down", code="CONNECTION")
    assert not policy.skips_retries(down, Options())
    assert policy.skips_retries(down, Options(fail_open=True))


def test_a_value_rebuilt_without_redis_is_kept_for_the_next_callers_unless_redis_is_up_and_full() -> None:
    # A full Redis still takes deletes: a copy kept in the process would outlive them.
    assert not policy.keeps_alone(RedisUnavailableError("full", code="OOM"))
    for code in ("CONNECTION", "MISCONF", None):
        assert policy.keeps_alone(RedisUnavailableError("down", code=code))


def test_a_refusal_of_writes_is_warned_of_once_an_interval_not_once_a_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Redis full: every read of a missing key rebuilds without the lease.
    policy._refusals.clear()
    full = RedisUnavailableError("OOM command not allowed", code="OOM")
    with caplog.at_level("DEBUG", logger="stampede"):
        for _ in range(100):
            policy.on_redis_failure("k", full, stale=False, options=Options(), emit=events_into([]))
        warned = [record for record in caplog.records if record.levelname == "WARNING"]
        assert len(warned) == 1
        assert len(caplog.records) == 100  # the others at debug
        policy._refusals["OOM"][0] -= policy.REFUSAL_WARNING_INTERVAL  # the interval has passed
        caplog.clear()
        policy.on_redis_failure("k", full, stale=False, options=Options(), emit=events_into([]))
    (again,) = caplog.records
    assert again.levelname == "WARNING"
    assert "99 more like it" in again.getMessage()
    # An outage is not a refusal: each call is warned of (until its breaker opens).
    caplog.clear()
    with caplog.at_level("WARNING", logger="stampede"):
        for _ in range(3):
            policy.on_redis_failure(
                "k", RedisUnavailableError("down"), stale=True, options=Options(), emit=events_into([])
            )
    assert len(caplog.records) == 3


@pytest.mark.parametrize(("call", "answer"), sorted(policy.FAILED_OPEN_ANSWERS.items()))
def test_a_plain_call_redis_failed_answers_as_an_empty_cache_under_fail_open(call: str, answer: Any) -> None:
    error = RedisUnavailableError("down", code="CONNECTION")
    with pytest.raises(RedisUnavailableError):
        policy.on_plain_failure(call, error, Options(), events_into([]))
    emitted: list[EventKind] = []
    assert policy.on_plain_failure(call, error, Options(fail_open=True), events_into(emitted)) == answer
    owing = call in policy.OWING_CALLS
    assert emitted == [EventKind.WRITE_DROPPED if owing else EventKind.FAIL_OPEN]


def test_a_failed_rebuild_backs_off_longer_with_each_failure_in_a_row_up_to_the_longest() -> None:
    pauses = [policy.failure(RuntimeError("x"), failures, lambda: 0.5) for failures in range(8)]
    assert [recorded.failures for recorded in pauses if recorded] == list(range(1, 9))
    backoffs = [recorded.backoff_ms for recorded in pauses if recorded]
    assert backoffs[0] == round(policy.REBUILD_FIRST_PAUSE * 1000)
    assert backoffs == sorted(backoffs)
    assert backoffs[-1] == round(policy.REBUILD_LONGEST_PAUSE * 1000)
    jittered = [policy.failure(RuntimeError("x"), 0, lambda r=r: r) for r in (0.0, 1.0)]
    low, high = (recorded.backoff_ms for recorded in jittered if recorded)
    assert low == round(policy.REBUILD_FIRST_PAUSE * (1 - policy.REBUILD_JITTER) * 1000)
    assert high == round(policy.REBUILD_FIRST_PAUSE * (1 + policy.REBUILD_JITTER) * 1000)
