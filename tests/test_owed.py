"""The removals an instance owes Redis after an outage under fail_open
(``stampede._core.owed``): kept in order, once per target, the stronger
kept, bounded."""

from __future__ import annotations

import pytest

from stampede._core import owed
from stampede._core.keys import KeySpace
from stampede._core.owed import EVERYTHING, Owed, OwedBook

KEYS = KeySpace("ns")


def test_removals_are_paid_in_the_order_they_were_made() -> None:
    book = OwedBook()
    removals = [
        Owed("delete", KEYS("a")),
        Owed("tags", tag=b"t"),
        Owed("invalidate", KEYS("b")),
        Owed("clear"),
    ]
    book.owe(*removals)
    assert book.pending
    assert book.due() == removals
    for removal in removals:
        book.paid(removal)
    assert not book.pending
    assert book.due() == []


def test_one_target_is_owed_once_and_the_stronger_removal_wins() -> None:
    book = OwedBook()
    book.owe(Owed("invalidate", KEYS("a"), as_of=1.0), Owed("delete", KEYS("b"), as_of=2.0))
    book.owe(Owed("delete", KEYS("a"), as_of=3.0))  # covers it: replaces it, and moves after b's
    # Later, as of a later time: what was written after the delete is marked stale.
    book.owe(Owed("invalidate", KEYS("b"), as_of=4.0))
    book.owe(Owed("delete", KEYS("b"), as_of=5.0))  # the later delete of b covers both
    book.owe(Owed("tags", tag=b"t"), Owed("tags", tag=b"t", hard=True))
    due = [
        (removal.kind, removal.keys and removal.keys.name, removal.hard, removal.as_of)
        for removal in book.due()
    ]
    assert due == [
        ("delete", "a", False, 3.0),
        ("delete", "b", False, 5.0),
        ("tags", None, True, None),
    ]


def test_a_removal_owed_again_while_being_paid_stays_owed() -> None:
    book = OwedBook()
    book.owe(Owed("delete", KEYS("a")))
    (sending,) = book.due()
    book.owe(Owed("invalidate", KEYS("a")))  # made after the delete was sent
    book.paid(sending)
    assert book.pending  # the later one is sent too


def test_past_its_bound_the_book_owes_one_deletion_of_the_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(owed, "MOST_OWED", 10)
    book = OwedBook()
    book.owe(*(Owed("delete", KEYS(f"k{i}")) for i in range(11)))
    assert book.due() == [EVERYTHING]
    assert len(book) == 1
    assert book.abandon() == 1
    assert not book.pending


def test_after_a_try_redis_failed_none_is_made_before_the_pause_ends() -> None:
    book = OwedBook()
    assert not book.may_pay(0.0)  # nothing owed
    book.owe(Owed("delete", KEYS("a")))
    assert book.may_pay(0.0)
    book.failed(5.0)
    assert not book.may_pay(4.9)  # callers queued behind a failed try go on at once
    assert book.may_pay(5.0)
