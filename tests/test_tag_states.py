"""The tag states a process holds: GETs of one state under way together, and
the namespace's state trusted for the reply of a GET sent while it was known.

No Redis: these drive ``TagStates`` by hand, on a clock of the test's own.
"""

from __future__ import annotations

import pytest

from stampede._core.tags import DELETED, NAMESPACE, TagStates

INTERVAL = 0.1
PREFIX = b"ns:{"
NAME = PREFIX + NAMESPACE + b"}:tag"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def states(clock: Clock) -> TagStates:
    made = TagStates(PREFIX, INTERVAL)
    made._monotonic = clock  # type: ignore[method-assign]
    return made


def state(current: int, deleted: int = 0) -> bytes:
    return f"{current}:{deleted}:0".encode()


def test_two_gets_under_way_together_each_keep_what_they_read(states: TagStates, clock: Clock) -> None:
    first = states.begin_fill(NAME)
    second = states.begin_fill(NAME)
    states.end_fill(NAME, first, state(5))
    assert states.known((NAMESPACE,)) == {NAMESPACE: (5, 0)}
    clock.now += INTERVAL  # lapsed; the second reply comes now
    assert states.known((NAMESPACE,)) is None
    states.end_fill(NAME, second, state(5))
    assert states.known((NAMESPACE,)) == {NAMESPACE: (5, 0)}


def test_a_reply_overtaken_by_a_newer_one_does_not_take_its_place(states: TagStates) -> None:
    older = states.begin_fill(NAME)
    newer = states.begin_fill(NAME)
    states.end_fill(NAME, newer, state(7))  # an invalidate_all it saw
    states.end_fill(NAME, older, state(5))
    assert states.known((NAMESPACE,)) == {NAMESPACE: (7, 0)}


def test_a_change_told_meanwhile_voids_every_get_under_way(states: TagStates) -> None:
    first = states.begin_fill(NAME)
    second = states.begin_fill(NAME)
    states.invalidate([NAME])
    states.end_fill(NAME, first, state(5))
    states.end_fill(NAME, second, state(5))
    assert states.known((NAMESPACE,)) is None
    # A GET sent after the change fills it again.
    third = states.begin_fill(NAME)
    states.end_fill(NAME, third, state(6))
    assert states.known((NAMESPACE,)) == {NAMESPACE: (6, 0)}


def test_a_get_sent_while_the_namespace_was_known_is_judged_by_it_when_back(
    states: TagStates, clock: Clock
) -> None:
    states.end_fill(NAME, states.begin_fill(NAME), state(5))
    sent = clock.now + INTERVAL / 2
    assert not states.namespace_due(sent)
    clock.now += 3 * INTERVAL  # a slow reply: the state lapsed on the way
    assert states.known((NAMESPACE,)) is None
    states.namespace_as_sent(sent)
    assert states.known((NAMESPACE,)) == {NAMESPACE: (5, 0)}
    # Only for GETs sent while it was known: the next is told to ask for it.
    assert states.namespace_due(clock.now)
    clock.now += INTERVAL
    states.namespace_as_sent(clock.now - INTERVAL / 2)
    assert states.known((NAMESPACE,)) is None


def test_with_no_check_interval_a_read_never_asks_for_the_namespace_with_an_entry(clock: Clock) -> None:
    exact = TagStates(PREFIX, 0)
    exact._monotonic = clock  # type: ignore[method-assign]
    assert not exact.namespace_due(clock.now)


TAG = b"t"
TAG_NAME = PREFIX + TAG + b"}:tag"


def test_a_caller_judges_by_a_state_it_read_even_if_another_forgot_it_meanwhile(states: TagStates) -> None:
    # Another caller's strict judge found it older than an entry it read, and
    # forgot it, between this caller's read and its judgement.
    fill = states.begin_fill(TAG_NAME)
    states.end_fill(TAG_NAME, fill, state(10, deleted=10))  # delete_tags, as read
    states._forget([TAG])
    assert states.known((TAG,)) is None  # the next strict judge reads it again
    assert states.verdict(0, ((TAG, 5),), strict=False) == DELETED


def test_a_state_a_capture_learned_does_not_void_a_get_sent_after_it(states: TagStates) -> None:
    fill = states.begin_fill(TAG_NAME)
    states.learned(TAG, state(5))  # read before the delete, its reply late
    states.end_fill(TAG_NAME, fill, state(10, deleted=10))
    assert states.known((TAG,)) == {TAG: (10, 10)}
    assert states.verdict(0, ((TAG, 5),)) == DELETED


def test_a_get_voided_by_a_change_told_meanwhile_still_judges_its_caller(states: TagStates) -> None:
    fill = states.begin_fill(TAG_NAME)
    states.invalidate([TAG_NAME])
    states.end_fill(TAG_NAME, fill, state(10, deleted=10))
    assert states.known((TAG,)) is None  # not trusted: read again by the next strict judge
    assert states.verdict(0, ((TAG, 5),), strict=False) == DELETED
