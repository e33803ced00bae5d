"""What a process remembers of other callers' leases for a moment
(``stampede._core.memos``): bounded by time as well as by count."""

from __future__ import annotations

from stampede._core.memos import (
    BUSY_MEMO_SECONDS,
    MOST_REMEMBERED,
    BusyLeases,
    FailedKeys,
    KeptAlone,
    UnfilledKeys,
)
from tests.fakes import FakeClock
from tests.machines import entry


def test_a_memo_of_ever_new_keys_holds_only_those_of_the_last_moment() -> None:
    clock, busy, unfilled, failed = FakeClock(), BusyLeases(), UnfilledKeys(), FailedKeys()
    stale = entry("old", clock, fresh_for=-1.0)
    for n in range(20_000):
        name = f"k{n}".encode()
        now = clock.monotonic()
        busy.note(name, now, 60_000, stale)
        unfilled.note(name, now, 60_000)
        failed.note(name, now, 60_000, "it raised")
        clock.advance(0.001)  # a thousand new keys a second
    noted_per_moment = int(BUSY_MEMO_SECONDS / 0.001)
    for memo in (busy, unfilled, failed):
        # The keys of the last moment, and at most as many again not yet swept out.
        assert noted_per_moment <= len(memo) <= 2 * noted_per_moment + 2, len(memo)
    now = clock.monotonic()
    assert busy.held(b"k19999", now, stale)
    assert not busy.held(b"k0", now, stale)
    assert unfilled.known(b"k19999", now)
    assert not unfilled.known(b"k0", now)
    assert failed.known(b"k19999", now) is not None
    assert failed.known(b"k0", now) is None


def test_a_memo_noting_more_keys_at_once_than_its_bound_forgets_them_rather_than_grow() -> None:
    clock, unfilled = FakeClock(), UnfilledKeys()
    now = clock.monotonic()
    for n in range(3 * MOST_REMEMBERED):
        unfilled.note(f"k{n}".encode(), now, 60_000)
        assert len(unfilled) <= MOST_REMEMBERED
    assert unfilled.known(f"k{3 * MOST_REMEMBERED - 1}".encode(), now)


def test_a_write_of_this_process_forgets_the_key() -> None:
    clock, unfilled = FakeClock(), UnfilledKeys()
    unfilled.note(b"k", clock.monotonic(), 60_000)
    unfilled.forget(b"k")
    assert not unfilled.known(b"k", clock.monotonic())


def test_what_was_kept_is_served_only_to_callers_turned_away_and_only_until_let_go() -> None:
    kept = KeptAlone()
    kept.keep(b"k", "kept", 0.0, 60)
    kept.answered()  # Redis answers again
    assert kept.get(b"k", 1.0) == (False, None)  # a caller that reached Redis: Redis has the say
    assert kept.get(b"k", 1.0, skipped=True) == (True, "kept")  # turned away just before
    kept.let_go()  # its moment is over: nothing is held for it any more
    assert kept.get(b"k", 1.0, skipped=True) == (False, None)
    assert len(kept) == 0
