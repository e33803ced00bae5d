"""The circuit breaker of one Redis (``stampede._core.breaker``), and which
failures open it (``stampede._protocol.errors``): on its own, on a clock
that moves only when told to."""

from __future__ import annotations

import random

import pytest
import redis.exceptions

from stampede._core.breaker import FIRST_PAUSE, JITTER, LONGEST_PAUSE, Breaker
from stampede._protocol.errors import Skipped, error_code, is_outage
from tests.fakes import FakeClock

DOWN = redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


def breaker() -> tuple[Breaker, FakeClock, list[bool]]:
    clock = FakeClock()
    changes: list[bool] = []
    made = Breaker(clock, lambda opened, error: changes.append(opened), rng=random.Random(7))
    return made, clock, changes


def test_closed_it_sends_no_probe_and_a_success_costs_nothing() -> None:
    made, _, changes = breaker()
    assert not made.tripped
    assert not any(made.probe_due() for _ in range(100))
    made.succeeded()
    assert changes == []
    assert made.retry_in() == 0


def test_a_failure_opens_it_then_one_probe_at_a_time_is_due_after_the_pause() -> None:
    made, clock, changes = breaker()
    made.failed(DOWN)
    assert changes == [True]
    assert made.tripped
    assert made.error is DOWN
    assert not made.probe_due()
    assert FIRST_PAUSE * (1 - JITTER) <= made.retry_in() <= FIRST_PAUSE * (1 + JITTER)
    clock.advance(FIRST_PAUSE * (1 + JITTER))
    assert made.probe_due()  # the caller told has the probe sent
    assert not made.probe_due()  # one at a time
    assert made.tripped  # every call is still refused meanwhile
    made.succeeded()
    assert changes == [True, False]
    assert not made.tripped


def test_failures_of_calls_sent_before_it_opened_do_not_lengthen_the_pause() -> None:
    made, _, changes = breaker()
    made.failed(DOWN)
    pause = made.retry_in()
    for _ in range(20):
        made.failed(DOWN)
    assert made.retry_in() == pause
    assert changes == [True]


def test_each_failed_probe_doubles_the_pause_up_to_the_longest() -> None:
    made, clock, changes = breaker()
    made.failed(DOWN)
    pauses = []
    for _ in range(10):
        clock.advance(made.retry_in())
        assert made.probe_due()
        made.failed(DOWN)
        pauses.append(made.retry_in())
    assert pauses[0] > FIRST_PAUSE * (1 + JITTER)  # doubled, whatever the jitter
    assert max(pauses) <= LONGEST_PAUSE * (1 + JITTER)
    assert min(pauses[-3:]) >= LONGEST_PAUSE * (1 - JITTER)
    assert changes == [True]


def test_a_probe_that_never_reports_is_replaced_after_another_pause() -> None:
    made, clock, _ = breaker()
    made.failed(DOWN)
    clock.advance(made.retry_in())
    assert made.probe_due()  # a probe that never reports (a task cancelled with its loop)
    assert not made.probe_due()
    clock.advance(FIRST_PAUSE)
    assert made.probe_due()


@pytest.mark.parametrize(
    ("error", "code", "outage"),
    [
        (DOWN, "CONNECTION", True),
        (redis.exceptions.TimeoutError("Timeout reading from socket"), "TIMEOUT", True),
        (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), "LOADING", True),
        (
            redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
            "OOM",
            False,
        ),
        (
            redis.exceptions.ResponseError(
                "Error running script (call to f_1): @user_script:27: -OOM command not allowed"
            ),
            "OOM",
            False,
        ),
        (
            redis.exceptions.ResponseError("MISCONF Redis is configured to save RDB snapshots"),
            "MISCONF",
            False,
        ),
        (redis.exceptions.ResponseError("BUSY Redis is busy running a script."), "BUSY", False),
        (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), "READONLY", False),
        (redis.exceptions.ConnectionError("max number of clients reached"), "MAXCLIENTS", False),
        (redis.exceptions.MaxConnectionsError("Too many connections"), "POOL", False),
        (redis.exceptions.ResponseError("ERR unknown command 'FOO'"), None, False),
        (Skipped(DOWN, 0.5), "CONNECTION", False),
    ],
)
def test_which_failures_are_an_outage(error: Exception, code: str | None, outage: bool) -> None:
    assert error_code(error) == code
    assert is_outage(error) is outage
