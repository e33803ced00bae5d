"""A rebuild that raises: its lease records the failure for every process, so
that nobody tries again before a growing back-off ends; callers with a stale
value are served it, callers with nothing get the error at once, and the
waiters of the failed attempt, in every process, get its error."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

import stampede
from stampede import RebuildFailedError
from stampede._core import policy
from stampede._core.keys import KeySpace
from tests.helpers import DatabaseDown, Rebuilds, failing, wait_until


@pytest.mark.usefixtures("long_backoff")
def test_after_a_rebuild_raised_others_get_its_error_at_once_without_a_rebuild(make_driver: Any) -> None:
    first, elsewhere = make_driver(), make_driver()  # two processes, to Redis
    attempts: list[int] = []
    with pytest.raises(DatabaseDown):
        first.get_or_rebuild("k", failing(attempts))
    for sf in (first, elsewhere, elsewhere):
        with pytest.raises(RebuildFailedError) as raised:
            sf.get_or_rebuild("k", failing(attempts))
        assert raised.value.key == "k"
        assert raised.value.error == "DatabaseDown: could not connect to server"
        assert raised.value.failures == 1
        assert 0 < raised.value.retry_in <= 60 * (1 + policy.REBUILD_JITTER)
    assert len(attempts) == 1


@pytest.mark.usefixtures("long_backoff")
def test_the_waiters_of_a_failed_rebuild_in_every_process_get_its_error(make_driver: Any) -> None:
    holder, elsewhere = make_driver(), make_driver()
    attempts: list[int] = []
    started = threading.Event()
    outcomes: list[BaseException | None] = []
    lock = threading.Lock()

    def wait_for_it() -> None:
        try:
            elsewhere.get_or_rebuild("k", failing(attempts), wait_timeout=30)
        except BaseException as exc:
            with lock:
                outcomes.append(exc)
        else:
            with lock:
                outcomes.append(None)

    holding = threading.Thread(target=lambda: outcomes.append(_raised(holder, attempts, started)))
    holding.start()
    assert started.wait(10)
    waiters = [threading.Thread(target=wait_for_it) for _ in range(8)]
    for waiter in waiters:
        waiter.start()
    for thread in [holding, *waiters]:
        thread.join(30)
    assert len(attempts) == 1
    kinds = sorted(type(outcome).__name__ for outcome in outcomes)
    assert kinds == ["DatabaseDown"] + ["RebuildFailedError"] * 8


def _raised(sf: Any, attempts: list[int], started: threading.Event) -> BaseException | None:
    try:
        sf.get_or_rebuild("k", failing(attempts, delay=0.5, started=started))
    except BaseException as exc:
        return exc
    return None


@pytest.mark.usefixtures("long_backoff")
def test_a_stale_value_is_served_through_the_back_off_and_never_made_an_error(make_driver: Any) -> None:
    sf, elsewhere = make_driver(), make_driver()
    sf.set("k", "stale", ttl=0.01, stale_ttl=600)
    wait_until(lambda: not sf.get("k").is_fresh())
    attempts: list[int] = []
    for instance in (sf, elsewhere, sf, elsewhere):
        assert instance.get_or_rebuild("k", failing(attempts)) == "stale"
    assert len(attempts) == 1
    entry = sf.get("k")
    assert entry.value == "stale"  # an error is never an invalidation


@pytest.mark.usefixtures("long_backoff")
def test_a_write_ends_the_back_off(make_driver: Any) -> None:
    sf = make_driver()
    attempts: list[int] = []
    with pytest.raises(DatabaseDown):
        sf.get_or_rebuild("k", failing(attempts))
    sf.delete("k")
    assert sf.get_or_rebuild("k", Rebuilds(lambda n: "back")) == "back"


def test_failures_in_a_row_are_counted_and_a_success_starts_again(
    make_driver: Any, monkeypatch: pytest.MonkeyPatch, client: redis.Redis, keys: KeySpace
) -> None:
    monkeypatch.setattr(policy, "REBUILD_FIRST_PAUSE", 0.05)
    sf = make_driver()
    attempts: list[int] = []
    told: list[tuple[int, int]] = []

    def attempt() -> bool:
        try:
            sf.get_or_rebuild("k", failing(attempts))
        except RebuildFailedError as exc:
            told.append((exc.failures, len(attempts)))
        except DatabaseDown:
            pass
        return len(attempts) >= 3

    wait_until(attempt)
    # Each caller inside a back-off is told how many attempts in a row raised.
    assert all(failures == made for failures, made in told), told
    assert client.get(keys("k").lease).startswith(b"!failed:3:")
    wait_until(lambda: _succeeds(sf))
    sf.invalidate("k")
    monkeypatch.setattr(policy, "REBUILD_FIRST_PAUSE", 60.0)
    assert sf.get_or_rebuild("k", failing(attempts)) == "back"  # stale, the rebuild having raised
    assert client.get(keys("k").lease).startswith(b"!failed:1:")  # the success ended the count


def _succeeds(sf: Any) -> bool:
    try:
        return bool(sf.get_or_rebuild("k", lambda: "back") == "back")
    except RebuildFailedError:
        return False


@pytest.mark.usefixtures("long_backoff")
def test_a_read_is_not_held_back_by_a_failed_rebuild(make_driver: Any) -> None:
    # A read's caller rebuilds by itself (a Django get, then the view's set).
    sf = make_driver()
    with pytest.raises(DatabaseDown):
        sf.get_or_rebuild("k", failing([]))
    read = sf.read("k")
    assert read.found is False
    assert read.lease is not None
    assert sf.commit(read.lease, "rendered")
    assert sf.get_or_rebuild("k", Rebuilds()) == "rendered"


def test_a_cancelled_or_interrupted_rebuild_records_nothing() -> None:
    assert policy.failure(KeyboardInterrupt(), 0, lambda: 0.5) is None
    recorded = policy.failure(DatabaseDown("x" * 1000), 2, lambda: 0.5)
    assert recorded is not None
    assert recorded.failures == 3
    assert recorded.backoff_ms == round(policy.REBUILD_FIRST_PAUSE * 4 * 1000)
    assert len(recorded.error) == policy.MOST_ERROR_TEXT


def test_rebuild_failed_error_is_a_stampede_error() -> None:
    assert issubclass(RebuildFailedError, stampede.StampedeError)


@pytest.mark.usefixtures("long_backoff")
def test_a_batch_whose_rebuild_raised_records_the_failure_on_each_key(make_driver: Any) -> None:
    batch, elsewhere = make_driver(), make_driver()
    calls: list[list[Any]] = []

    def rebuild_many(keys: list[Any]) -> dict[Any, Any]:
        calls.append(list(keys))
        raise DatabaseDown("could not connect to server")

    with pytest.raises(DatabaseDown):
        batch.get_or_rebuild_many(["a", "b"], rebuild_many)
    attempts: list[int] = []
    for key in ("a", "b"):
        with pytest.raises(RebuildFailedError) as raised:
            elsewhere.get_or_rebuild(key, failing(attempts))
        assert raised.value.error == "DatabaseDown: could not connect to server"
        assert raised.value.failures == 1
    # Nor does the batch itself try again within the back-off.
    with pytest.raises(RebuildFailedError):
        batch.get_or_rebuild_many(["a", "b"], rebuild_many)
    assert attempts == []
    assert calls == [["a", "b"]]
