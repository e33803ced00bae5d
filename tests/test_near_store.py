"""The near cache's store on its own: bounds, fill fencing, invalidation."""

from __future__ import annotations

import pickle
import time

import pytest

from stampede import ConfigurationError
from stampede._core import near
from stampede._core.near import CHECK_SECONDS, NOT_HERE, Copy, NearCache, NearStore


def live_store(**settings: int) -> NearStore:
    store = NearStore(NearCache(**settings), b"ns:{")
    store.flush(live=True)
    return store


def fill(store: NearStore, name: bytes, raw: bytes) -> None:
    store.end_fill(name, store.begin_fill(name), raw)


def test_nothing_is_kept_or_served_until_live() -> None:
    store = NearStore(NearCache(), b"ns:{")
    fill(store, b"ns:{a", b"x")
    assert store.get(b"ns:{a") is None
    store.flush(live=True)
    fill(store, b"ns:{a", b"x")
    assert store.get(b"ns:{a") == b"x"
    store.flush(live=False)  # the connection was lost
    assert store.get(b"ns:{a") is None


def test_an_invalidation_between_get_and_fill_keeps_the_old_value_out() -> None:
    store = live_store()
    token = store.begin_fill(b"ns:{a")
    store.invalidate([b"ns:{a"])  # a write landed after our GET was answered
    store.end_fill(b"ns:{a", token, b"old")
    assert store.get(b"ns:{a") is None
    token = store.begin_fill(b"ns:{a")
    store.invalidate(None)  # a flush
    store.end_fill(b"ns:{a", token, b"old")
    assert store.get(b"ns:{a") is None


def test_entries_and_bytes_are_bounded_least_recently_used_first() -> None:
    store = live_store(max_entries=2, max_bytes=10, max_value_bytes=8)
    fill(store, b"a", b"1111")
    fill(store, b"b", b"2222")
    assert store.get(b"a") == b"1111"  # a is now the most recently used
    fill(store, b"c", b"3333")
    assert (store.get(b"a"), store.get(b"b"), store.get(b"c")) == (b"1111", None, b"3333")
    fill(store, b"d", b"44444444")  # 8 bytes: the others must go to stay within 10
    assert len(store) == 1
    fill(store, b"e", b"555555555")  # larger than max_value_bytes: not kept
    assert store.get(b"e") is None
    assert store.counts["evictions"] == 3


@pytest.mark.parametrize(("setting", "words"), [(-1, "max_entries"), ("many", "number of entries")])
def test_bad_settings_name_the_argument(setting: object, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        NearCache.from_setting(setting)
    assert NearCache.from_setting(None) is None
    assert NearCache.from_setting(500) == NearCache(max_entries=500)


# --- the hot index ---------------------------------------------------------------


class Now:
    """The monotonic clock the hot index is served by, moved by the test alone:
    a check's 1 ms must not lapse because the machine is busy."""

    def __init__(self) -> None:
        self.value = time.monotonic()

    def __call__(self) -> float:
        return self.value


@pytest.fixture(autouse=True)
def now(monkeypatch: pytest.MonkeyPatch) -> Now:
    clock = Now()
    monkeypatch.setattr(near, "_monotonic", clock)
    return clock


def hot_store(**settings: int) -> NearStore:
    """A live store whose tracking connection was just found quiet."""
    store = live_store(**settings)
    store.tracked.heartbeat.live(near._monotonic())
    store.tracked.quiet_at(near._monotonic())
    return store


def index(store: NearStore, key: str, name: bytes, raw: bytes | None = None, fresh_for: float = 60.0) -> None:
    """Index the copy ``raw`` of ``name`` (default: the one held) under ``key``."""
    held = store.get(name) if raw is None else raw
    assert held is not None
    payload = pickle.dumps([key])
    store.index(key, name, held, lambda: Copy(held, payload, pickle.loads, time.time() + fresh_for))


def test_a_hot_copy_serves_a_value_of_its_own_each_time() -> None:
    store = hot_store()
    fill(store, b"ns:{a", b"raw-a")
    index(store, "a", b"ns:{a")
    hits = store.counts["hits"]
    first, second = store.serve("a"), store.serve("a")
    assert first == second == ["a"]
    assert first is not second
    assert store.serve("b") is NOT_HERE
    assert store.counts["hits"] == hits + 2


def test_a_hot_copy_goes_with_its_copy_and_with_any_tag_state() -> None:
    store = hot_store()
    for key in "ab":
        fill(store, b"ns:{" + key.encode(), b"raw")
        index(store, key, b"ns:{" + key.encode())
    store.invalidate([b"ns:{a"])
    assert store.serve("a") is NOT_HERE
    assert store.serve("b") == ["b"]
    store.invalidate([b"ns:{t}:tag"])  # a tag's state changed: what b was judged by
    assert store.serve("b") is NOT_HERE
    assert store.get(b"ns:{b") == b"raw"  # the copy itself stays, judged again when read


def test_hot_copies_are_served_only_within_the_check_and_while_fresh(now: Now) -> None:
    store = hot_store()
    fill(store, b"ns:{a", b"raw")
    index(store, "a", b"ns:{a")
    fill(store, b"ns:{old", b"raw")
    index(store, "old", b"ns:{old", fresh_for=-1)
    assert store.serve("a") == ["a"]
    assert store.serve("old") is NOT_HERE  # stale: the flow's
    now.value += CHECK_SECONDS * 2
    assert store.serve("a") is NOT_HERE  # the connection must be checked again
    store.tracked.quiet_at(now())
    assert store.serve("a") == ["a"]
    store.flush(live=False)
    assert store.serve("a") is NOT_HERE


def test_a_copy_replaced_since_it_was_read_is_not_indexed() -> None:
    store = hot_store()
    fill(store, b"ns:{a", b"old")
    served = store.get(b"ns:{a")
    fill(store, b"ns:{a", b"new")  # a fill after the read that served b"old"
    index(store, "a", b"ns:{a", served)
    assert store.serve("a") is NOT_HERE


def test_eviction_spares_copies_hit_from_the_hot_index() -> None:
    store = hot_store(max_entries=2)
    for key in "ab":
        fill(store, b"ns:{" + key.encode(), key.encode())
        index(store, key, b"ns:{" + key.encode())
    assert store.serve("a") == ["a"]  # a is the oldest, but hit (from the index: no move to the end)
    fill(store, b"ns:{c", b"c")
    assert store.get(b"ns:{a") == b"a"
    assert store.get(b"ns:{b") is None
    assert store.serve("b") is NOT_HERE


def test_an_inflated_payload_counts_against_max_bytes() -> None:
    store = hot_store(max_bytes=100)
    fill(store, b"ns:{a", b"z" * 10)
    held = store.get(b"ns:{a")
    assert held is not None
    until = time.time() + 60
    store.index("a", b"ns:{a", held, lambda: Copy(held, pickle.dumps("x" * 200), pickle.loads, until))
    assert store.serve("a") is NOT_HERE  # inflated, it would not fit: not indexed
    store.index("a", b"ns:{a", held, lambda: Copy(held, pickle.dumps("x" * 40), pickle.loads, until))
    assert "a" in store.hot
    fill(store, b"ns:{b", b"y" * 60)  # the inflated copy counts: 10 + 50-odd + 60 > 100
    assert store.get(b"ns:{a") is None
    assert store.serve("a") is NOT_HERE
    assert store.get(b"ns:{b") == b"y" * 60
