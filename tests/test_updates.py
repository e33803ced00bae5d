"""An update in place of a signed value by compare-and-set (``stampede._core.updates``),
driven by hand: no Redis, no real clock."""

from __future__ import annotations

from typing import Any

import pytest

from stampede import StampedeError
from stampede._core.ops import Op, Reread, Sleep, Swap
from stampede._core.updates import swapped
from tests.fakes import FakeClock
from tests.machines import calls_with, drive, kinds, stored


def plus_one(raw: bytes) -> tuple[bytes, str]:
    return raw + b"+", ""


def test_an_update_overtaken_by_another_write_is_made_again_from_the_newer_value() -> None:
    clock = FakeClock()
    settings = calls_with(clock).settings
    keys = settings.keys("k")
    first, second = stored(1, clock, fresh_for=60), stored(2, clock, fresh_for=60)
    reads = iter([first, second])
    swaps = iter([False, True])

    def answer(op: Op) -> Any:
        if isinstance(op, Reread):
            return next(reads)
        if isinstance(op, Swap):
            return next(swaps)
        assert isinstance(op, Sleep)
        return None

    changed, ops = drive(swapped(settings, keys, plus_one), answer)
    assert changed == second
    assert kinds(ops) == [Reread, Swap, Sleep, Reread, Swap]
    assert ops[4] == Swap(second, second + b"+", "")


def test_nothing_to_update_is_none_and_no_swap_is_tried() -> None:
    clock = FakeClock()
    settings = calls_with(clock).settings
    changed, ops = drive(swapped(settings, settings.keys("k"), plus_one), lambda op: None)
    assert changed is None
    assert kinds(ops) == [Reread]
    forged, ops = drive(swapped(settings, settings.keys("k"), plus_one), lambda op: b"not an envelope")
    assert forged is None
    assert kinds(ops) == [Reread]


def test_an_update_always_overtaken_gives_up_after_wait_timeout() -> None:
    clock = FakeClock()
    settings = calls_with(clock, wait_timeout=0.5).settings
    raw = stored(1, clock, fresh_for=60)

    def answer(op: Op) -> Any:
        if isinstance(op, Sleep):
            clock.advance(0.05)  # at least the longest pause, whatever the draw
            return None
        return raw if isinstance(op, Reread) else False

    with pytest.raises(StampedeError, match="kept changing under this update for wait_timeout"):
        drive(swapped(settings, settings.keys("k"), plus_one), answer)
    assert clock.monotonic() <= 0.5 + 0.05
