"""``stale_if_error`` (RFC 5861): past ``ttl + stale_ttl`` a value is kept
that long more, served only when what would replace it fails (its rebuild
raised, or is in its back-off, or Redis failed); otherwise it is a miss, and
callers wait for the one rebuild rather than be served it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

import stampede
from stampede.testing import RedisServer
from tests.helpers import Rebuilds, failing, wait_until
from tests.observers import Recorder


def _past_its_stale_window(sf: Any, key: str, value: Any) -> None:
    """``value`` stored under ``key``, past its ttl and stale_ttl, kept for errors."""
    sf.set(key, value, ttl=0.05, stale_ttl=0.05)
    wait_until(lambda: sf.get(key).fresh_until + 0.05 < time.time())


def test_stale_if_error_is_a_validated_option() -> None:
    assert stampede.Options(stale_if_error=30).stale_if_error == 30.0
    with pytest.raises(stampede.ConfigurationError, match="stale_if_error") as raised:
        stampede.Options(stale_if_error=-1)
    assert raised.value.field == "stale_if_error"
    # Redis keeps the value for its errors too.
    assert stampede.Options(ttl=10, stale_ttl=5, stale_if_error=60).expire_ms == 75_000


@pytest.mark.usefixtures("long_backoff")
def test_a_value_kept_for_errors_is_served_when_its_rebuild_raises_and_through_the_back_off(
    make_driver: Any,
) -> None:
    sf, elsewhere = make_driver(stale_if_error=600), make_driver(stale_if_error=600)
    _past_its_stale_window(sf, "k", "old")
    attempts: list[int] = []
    for instance in (sf, elsewhere, sf, elsewhere):
        assert instance.get_or_rebuild("k", failing(attempts)) == "old"
    assert len(attempts) == 1  # the others were inside the back-off: no rebuild
    many = elsewhere.get_or_rebuild_many(["k"], lambda keys: {key: 1 / 0 for key in keys})
    assert many == {"k": "old"}
    assert len(attempts) == 1


def test_a_value_kept_for_errors_is_not_served_while_its_rebuild_succeeds(make_driver: Any) -> None:
    sf = make_driver(stale_if_error=600)
    _past_its_stale_window(sf, "k", "old")
    assert sf.get_or_rebuild("k", lambda: "new") == "new"
    _past_its_stale_window(sf, "b", "old")
    assert sf.get_or_rebuild_many(["b"], lambda keys: dict.fromkeys(keys, "new")) == {"b": "new"}


def test_while_one_rebuilds_the_others_wait_for_its_value_not_the_kept_one(make_driver: Any) -> None:
    holder, elsewhere = make_driver(stale_if_error=600), make_driver(stale_if_error=600)
    _past_its_stale_window(holder, "k", "old")
    started, finish = threading.Event(), threading.Event()

    def slow_rebuild() -> str:
        started.set()
        assert finish.wait(10)
        return "new"

    results: list[Any] = []
    holding = threading.Thread(target=lambda: results.append(holder.get_or_rebuild("k", slow_rebuild)))
    holding.start()
    assert started.wait(10)
    waiters = [
        threading.Thread(target=lambda: results.append(elsewhere.get_or_rebuild("k", Rebuilds())))
        for _ in range(4)
    ]
    for waiter in waiters:
        waiter.start()
    wait_until(lambda: elsewhere._calls.flights.followers() >= 3)
    assert results == []  # nobody was served the value kept for errors
    finish.set()
    for thread in [holding, *waiters]:
        thread.join(10)
    assert results == ["new"] * 5


def test_a_value_kept_for_errors_is_served_when_redis_fails(server: RedisServer, make_driver: Any) -> None:
    options = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
    sf = make_driver(server.url, stale_if_error=600, redis_options=options)
    _past_its_stale_window(sf, "k", "old")
    admin = redis.Redis.from_url(server.url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)  # the lease cannot be written: Redis refuses it
    try:
        assert sf.get_or_rebuild("k", Rebuilds()) == "old"
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()


def test_a_value_kept_for_errors_that_is_invalidated_meanwhile_is_not_taken_for_a_new_one(
    make_driver: Any,
) -> None:
    # A waiter waits for bytes other than the value kept for errors. That
    # value marked stale in place (an invalidation) is not a rebuild landing.
    recorder = Recorder()
    holder = make_driver(stale_if_error=600)
    waiting = make_driver(stale_if_error=600, on_event=recorder)
    _past_its_stale_window(holder, "k", "old")
    started, finish = threading.Event(), threading.Event()

    def slow_rebuild() -> str:
        started.set()
        assert finish.wait(10)
        return "new"

    results: list[Any] = []
    holding = threading.Thread(target=lambda: results.append(holder.get_or_rebuild("k", slow_rebuild)))
    holding.start()
    assert started.wait(10)
    waiter = threading.Thread(target=lambda: results.append(waiting.get_or_rebuild("k", lambda: "waiter's")))
    waiter.start()
    wait_until(lambda: recorder.count(stampede.EventKind.LEASE_BUSY) >= 1)
    holder.invalidate("k")  # in place: the holder's lease dropped, its bytes changed
    waiter.join(10)
    finish.set()
    holding.join(10)
    assert "old" not in results, results
