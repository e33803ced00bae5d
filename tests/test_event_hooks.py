"""stampede.hook_from: the on_event hooks a setting names, called in turn."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

import stampede
from stampede import Event, EventKind

KEY = "report:daily"


def record_here(event: Event) -> None:
    """A hook named by its dotted path in the tests below."""
    RECORDED.append(event)


RECORDED: list[Event] = []


def test_hooks_are_all_called_in_order_though_one_raises(
    client: redis.Redis, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    def first(event: Event) -> None:
        calls.append("first")

    def broken(event: Event) -> None:
        calls.append("broken")
        raise RuntimeError("a broken observer")

    RECORDED.clear()
    hook = stampede.hook_from([first, broken, "tests.test_event_hooks.record_here"])
    sf = stampede.Stampede(client, namespace=namespace, on_event=hook)
    with caplog.at_level(logging.ERROR, logger="stampede"):
        assert sf.get_or_rebuild(KEY, lambda: "v", ttl=60) == "v"
    kinds = [event.kind for event in RECORDED]
    assert kinds == [EventKind.MISS, EventKind.LEASE_WON, EventKind.REBUILD]
    assert calls == ["first", "broken"] * 3
    assert "a broken observer" in caplog.text
    sf.close()


def test_hook_from_settings() -> None:
    assert stampede.hook_from(None) is None
    assert stampede.hook_from([]) is None
    assert stampede.hook_from([print]) is print
    assert stampede.hook_from("tests.test_event_hooks.record_here") is record_here
    # Read twice, a setting gives equal hooks (Django compares its configurations).
    assert stampede.hook_from([print, "tests.test_event_hooks.record_here"]) == stampede.hook_from(
        (print, record_here)
    )
    assert hash(stampede.hook_from([print, record_here])) == hash(stampede.hook_from([print, record_here]))


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (42, r"^ON_EVENT must be a callable, its dotted path, or a list of them, got 42$"),
        ("nope.missing", r"^ON_EVENT 'nope.missing' cannot be imported: No module named 'nope'"),
        ([print, "stampede.nothing"], r"^ON_EVENT\[1\] 'stampede.nothing' cannot be imported"),
        ([print, 42], r"^ON_EVENT\[1\] must be a callable or its dotted path, got 42$"),
        ("stampede.prometheus.Metrics", r"^ON_EVENT names the class Metrics: give an instance"),
    ],
)
def test_hook_from_names_the_setting(setting: Any, message: str) -> None:
    with pytest.raises(stampede.ConfigurationError, match=message):
        stampede.hook_from(setting, "ON_EVENT")
