"""The near cache's store on its own: bounds, fill fencing, invalidation."""

from __future__ import annotations

import pytest

from stampede import ConfigurationError
from stampede._core.near import NearCache, NearStore


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
