"""The callers of one process, decided by the core alone (``stampede._core.calls``):
who leads a key's flight, what its followers are given, when they wait and for
how long; driven by hand, with no Redis and no real clock."""

from __future__ import annotations

from typing import Any

import pytest

from stampede import EventKind, RedisUnavailableError, WaitTimeoutError
from stampede._core.lease import Read
from stampede._core.ops import (
    Acquire,
    Acquired,
    AwaitFlight,
    Capture,
    Commit,
    FirstRead,
    InBackground,
    Keep,
    Lookup,
    Op,
    ReadTags,
    Rebuild,
    Rebuilt,
    Release,
    Wait,
)
from stampede._core.scope import LeaseScope
from stampede._core.tags import Captured
from tests.fakes import FakeClock
from tests.machines import calls_with, drive, entry, kinds


def lead_until_rebuild(steps: Any) -> Op:
    """Step a leader's machine up to its rebuild (the lease won); returns that op."""
    op = steps.send(None)
    assert isinstance(op, Acquire)
    op = steps.send(Acquired(True, None, won_at="1"))
    assert isinstance(op, Capture)  # the tags, before the rebuild reads its data
    op = steps.send(Captured(0))
    assert isinstance(op, Rebuild)
    return op


def finish_leader(steps: Any, value: Any) -> Any:
    """A leader stopped at its rebuild: rebuilt ``value``, committed, done."""
    op = steps.send(Rebuilt(value, None, 0.1))
    assert isinstance(op, Commit)
    # What it stored is judged by the tag states it records, read (not known lately).
    assert steps.send(True) == ReadTags((b"",))
    with pytest.raises(StopIteration) as stop:
        steps.send(True)
    return stop.value.value


def test_the_first_caller_of_a_key_leads_and_the_next_waits_for_its_outcome() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    keys = calls.settings.keys("k")
    leader = calls.get_or_rebuild(keys, calls.settings.options, Lookup(None), (), can_wait=True)
    lead_until_rebuild(leader)
    follower = calls.get_or_rebuild(keys, calls.settings.options, Lookup(None), (), can_wait=True)
    waiting = follower.send(None)
    assert isinstance(waiting, AwaitFlight)  # no Redis operation: it waits for the leader
    assert waiting.timeout == calls.settings.options.wait_timeout
    assert finish_leader(leader, "built") == "built"
    assert waiting.done.is_set()
    with pytest.raises(StopIteration) as stop:
        follower.send(True)
    assert stop.value.value == "built"
    assert len(calls.flights) == 0


def test_a_follower_that_joins_after_the_leaders_last_question_to_redis_reads_again() -> None:
    # What the leader asked may predate a write another process made and
    # returned from before this follower came: the follower reads again.
    clock = FakeClock()
    calls = calls_with(clock)
    keys = calls.settings.keys("k")
    leader = calls.get_or_rebuild(keys, calls.settings.options, Lookup(None), (), can_wait=True)
    lead_until_rebuild(leader)
    assert isinstance(leader.send(Rebuilt("built", None, 0.1)), Commit)
    assert leader.send(True) == ReadTags((b"",))  # its last question
    clock.advance(0.01)
    follower = calls.get_or_rebuild(keys, calls.settings.options, Lookup(None), (), can_wait=True)
    assert isinstance(follower.send(None), AwaitFlight)
    with pytest.raises(StopIteration) as stop:
        leader.send(True)
    assert stop.value.value == "built"
    assert isinstance(follower.send(True), FirstRead)  # not the leader's outcome


def test_followers_share_a_rebuild_without_the_lease_however_late_they_join() -> None:
    # Redis full (noeviction) refuses the lease: the leader rebuilds alone,
    # and nothing could vouch for a reread; the process's callers share it.
    clock = FakeClock()
    calls = calls_with(clock)
    keys = calls.settings.keys("k")
    leader = calls.get_or_rebuild(keys, calls.settings.options, Lookup(None), (), can_wait=True)
    assert isinstance(leader.send(None), Acquire)
    freed = leader.throw(RedisUnavailableError("OOM command not allowed", code="OOM"))
    assert isinstance(freed, Release)  # a lease granted unseen, freed in the background
    assert leader.send(None) == Rebuild(None)
    clock.advance(0.01)
    follower = calls.get_or_rebuild(keys, calls.settings.options, Lookup(None), (), can_wait=True)
    assert isinstance(follower.send(None), AwaitFlight)
    with pytest.raises(StopIteration) as led:
        leader.send(Rebuilt("built alone", None, 0.1))
    assert led.value.value == "built alone"
    with pytest.raises(StopIteration) as followed:
        follower.send(True)
    assert followed.value.value == "built alone"  # one rebuild for the process's callers


def test_a_follower_with_a_stale_value_in_hand_is_served_it_at_once() -> None:
    clock, events = FakeClock(), list[Any]()
    calls = calls_with(clock, events)
    keys = calls.settings.keys("k")
    options = calls.settings.options
    old = entry("old", clock, fresh_for=-5)
    leader = calls.get_or_rebuild(keys, options, Lookup(old), (), can_wait=True)
    assert isinstance(leader.send(None), Acquire)
    value, ops = drive(calls.get_or_rebuild(keys, options, Lookup(old), (), can_wait=True), _no_answer)
    assert value == "old"
    assert ops == []
    assert [event.kind for event in events] == [EventKind.STALE_HIT]


def test_a_follower_that_may_not_wait_rebuilds_for_itself_without_a_lease() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    keys = calls.settings.keys("k")
    options = calls.settings.options
    leader = calls.get_or_rebuild(keys, options, Lookup(None), (), can_wait=True)
    lead_until_rebuild(leader)
    value, ops = drive(
        calls.get_or_rebuild(keys, options, Lookup(None), (), can_wait=False),
        lambda op: Rebuilt("mine", None, 0.1),
    )
    assert value == "mine"
    assert ops == [Rebuild(None)]


@pytest.mark.parametrize("policy", ["raise", "rebuild"])
def test_a_follower_that_waited_wait_timeout_in_vain_follows_the_policy(policy: str) -> None:
    clock = FakeClock()
    calls = calls_with(clock, on_wait_timeout=policy)
    keys = calls.settings.keys("k")
    options = calls.settings.options
    leader = calls.get_or_rebuild(keys, options, Lookup(None), (), can_wait=True)
    lead_until_rebuild(leader)

    def answer(op: Op) -> Any:
        if isinstance(op, AwaitFlight):
            return False  # the leader's rebuild outlasted wait_timeout
        assert isinstance(op, Rebuild)
        return Rebuilt("alone", None, 0.1)

    steps = calls.get_or_rebuild(keys, options, Lookup(None), (), can_wait=True)
    if policy == "raise":
        with pytest.raises(WaitTimeoutError):
            drive(steps, answer)
        return
    value, ops = drive(steps, answer)
    assert value == "alone"
    assert kinds(ops) == [AwaitFlight, Rebuild]
    assert ops[1] == Rebuild(None)  # rebuilt for this caller only, stored nowhere


def test_callers_that_gave_up_waiting_share_one_fallback_rebuild() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    keys = calls.settings.keys("k")
    options = calls.settings.options
    leader = calls.get_or_rebuild(keys, options, Lookup(None), (), can_wait=True)
    lead_until_rebuild(leader)
    first = calls.get_or_rebuild(keys, options, Lookup(None), (), can_wait=True)
    assert isinstance(first.send(None), AwaitFlight)
    assert first.send(False) == Rebuild(None)  # leads the fallback
    second = calls.get_or_rebuild(keys, options, Lookup(None), (), can_wait=True)
    assert isinstance(second.send(None), AwaitFlight)
    waiting = second.send(False)
    assert isinstance(waiting, AwaitFlight)  # joins the fallback, with no bound of its own
    assert waiting.timeout is None
    with pytest.raises(StopIteration):
        first.send(Rebuilt("fallback", None, 0.1))
    with pytest.raises(StopIteration) as stop:
        second.send(True)
    assert stop.value.value == "fallback"


def test_a_follower_that_joined_after_this_process_wrote_the_key_reads_it_again() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    keys = calls.settings.keys("k")
    options = calls.settings.options
    leader = calls.get_or_rebuild(keys, options, Lookup(None), (), can_wait=True)
    lead_until_rebuild(leader)
    calls.written(keys)  # a set() of this process, while the leader rebuilds
    follower = calls.get_or_rebuild(keys, options, Lookup(None), (), can_wait=True)
    assert isinstance(follower.send(None), AwaitFlight)
    finish_leader(leader, "older")
    fresh = entry("set", clock, fresh_for=60)
    assert isinstance(follower.send(True), FirstRead)  # not the leader's older outcome
    with pytest.raises(StopIteration) as stop:
        follower.send(fresh)
    assert stop.value.value == "set"


def test_a_stale_key_refreshes_in_the_background_while_its_leader_is_served_stale() -> None:
    clock = FakeClock()
    calls = calls_with(clock, background=True)
    keys = calls.settings.keys("k")
    options = calls.settings.options
    old = entry("old", clock, fresh_for=-5)
    steps = calls.get_or_rebuild(keys, options, Lookup(old), (), can_wait=True)
    op = steps.send(None)
    assert isinstance(op, InBackground)
    with pytest.raises(StopIteration) as stop:
        steps.send(None)
    assert stop.value.value == "old"
    assert len(calls.flights) == 1  # the refresh leads the flight until it is done
    value, ops = drive(op.steps, _lease_and_commit)
    assert value == "new"
    assert kinds(ops) == [Acquire, Rebuild, Commit, ReadTags]  # what it stored, judged
    assert len(calls.flights) == 0


def test_a_background_refresh_that_cannot_start_frees_the_flight() -> None:
    clock = FakeClock()
    calls = calls_with(clock, background=True)
    keys = calls.settings.keys("k")
    old = entry("old", clock, fresh_for=-5)
    steps = calls.get_or_rebuild(keys, calls.settings.options, Lookup(old), (), can_wait=True)
    assert isinstance(steps.send(None), InBackground)
    with pytest.raises(StopIteration) as stop:
        steps.throw(RuntimeError("shutting down"))
    assert stop.value.value == "old"
    assert len(calls.flights) == 0


def test_a_read_that_wins_the_lease_hands_it_out_and_its_scope_keeps_it() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    keys = calls.settings.keys("k")
    scope = LeaseScope()
    steps = calls.read(
        keys, "k", calls.settings.options, Lookup(None), (), can_wait=True, scope=scope, owner="me"
    )
    read, ops = drive(steps, _lease_and_commit)
    assert isinstance(read, Read)
    assert read.found is False
    assert read.lease is not None
    assert kinds(ops) == [Acquire, Keep]  # paused at the rebuild: the caller rebuilds
    assert ops[0] == Acquire(read.lease.token, reads=True)
    assert scope._reader("ns", "k") == "me"


def test_another_reader_of_the_same_unit_misses_at_once_and_the_same_reader_gives_it_back() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    keys = calls.settings.keys("k")
    scope = LeaseScope()
    steps = calls.read(
        keys, "k", calls.settings.options, Lookup(None), (), can_wait=True, scope=scope, owner="me"
    )
    read, _ = drive(steps, _lease_and_commit)
    assert read.lease is not None
    other, ops = drive(calls.reread_in_scope(scope, "k", "other"), _no_answer)
    assert other == Read(False)
    assert ops == []
    again, ops = drive(calls.reread_in_scope(scope, "k", "me"), lambda op: None)
    assert again is None  # read on, the lease given back marked unfilled
    assert ops == [Release(read.lease.token, unfilled=True)]


def test_a_read_of_a_key_found_unfilled_moments_ago_misses_without_asking_redis() -> None:
    clock, events = FakeClock(), list[Any]()
    calls = calls_with(clock, events)
    keys = calls.settings.keys("k")
    calls.unfilled.note(keys.value, clock.monotonic(), 60_000)
    steps = calls.read(
        keys, "k", calls.settings.options, Lookup(None), (), can_wait=True, scope=None, owner=None
    )
    read, ops = drive(steps, _no_answer)
    assert read == Read(False, unfilled=True)
    assert ops == []
    assert [event.kind for event in events] == [EventKind.MISS, EventKind.UNFILLED]


def test_a_read_waiting_for_its_process_gives_up_at_wait_timeout() -> None:
    clock = FakeClock()
    calls = calls_with(clock)
    keys = calls.settings.keys("k")
    options = calls.settings.options
    first = calls.read(keys, "k", options, Lookup(None), (), can_wait=True, scope=None, owner=None)
    assert isinstance(first.send(None), Acquire)  # leads, asking for the lease
    second = calls.read(keys, "k", options, Lookup(None), (), can_wait=True, scope=None, owner=None)
    waiting = second.send(None)
    assert isinstance(waiting, AwaitFlight)
    with pytest.raises(StopIteration) as stop:
        second.send(False)
    assert stop.value.value == Read(False)


def _lease_and_commit(op: Op) -> Any:
    if isinstance(op, Acquire):
        return Acquired(True, None, won_at="1")
    if isinstance(op, Rebuild):
        return Rebuilt("new", None, 0.1)
    if isinstance(op, Commit):
        return True
    if isinstance(op, Wait):
        raise AssertionError("nobody else holds the lease")
    return None


def _no_answer(op: Op) -> Any:
    raise AssertionError(f"asked for {op!r}: no operation was expected")
