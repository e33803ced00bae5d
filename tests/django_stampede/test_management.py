"""``manage.py stampede``: the ``stampede`` command on a cache of ``CACHES``,
keys given as the application gives them, through Django's own command runner."""

from __future__ import annotations

import io
import itertools
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.test import override_settings

from stampede._protocol.messages import holder

_namespaces = itertools.count()


@pytest.fixture(autouse=True)
def prefixed_cache() -> Iterator[None]:
    url = os.environ["STAMPEDE_TEST_REDIS_URL"]
    namespace = f"manage{os.getpid()}-{next(_namespaces)}"
    caches_setting = {
        "default": {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": url,
            "KEY_PREFIX": "shop",
            "VERSION": 3,
            "OPTIONS": {"STALE_TTL": 600, "NAMESPACE": namespace},
        },
        "other": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    with override_settings(CACHES=caches_setting):
        yield
        cache.clear()


def stampede_command(*argv: str) -> str:
    out = io.StringIO()
    call_command("stampede", *argv, stdout=out)
    return out.getvalue()


def test_inspect_takes_the_applications_key_and_shows_its_entry_and_lease() -> None:
    cache.set("orders:count", 12, tags=["orders"])
    cache.invalidate_tags("orders")
    assert cache.get("orders:count") is None  # this request refreshes it: it holds the lease
    (report,) = json.loads(stampede_command("--json", "inspect", "orders:count"))
    assert report["key"] == "orders:count"
    assert (report["status"], report["because"]) == ("stale", "invalidated by tag 'orders'")
    assert report["format"] == "int"
    assert [(tag["name"], tag["since"]) for tag in report["tags"]] == [("orders", "invalidated")]
    assert (report["lease"]["state"], report["lease"]["holder"]) == ("held", holder())
    text = stampede_command("inspect", "orders:count", "--json")
    assert json.loads(text)[0]["status"] == "stale"


def test_the_tag_commands_and_stats_run_on_the_configured_cache() -> None:
    cache.set("a", 1, tags=["x"])
    cache.set("b", 2)
    assert "delete-tags: 'x'" in stampede_command("delete-tags", "x")
    assert cache.get("a") is None
    found: dict[str, Any] = json.loads(stampede_command("--json", "stats"))
    assert found["entries"] == 2  # a is there still, read as missing
    assert found["tag_states"] == 1
    assert found["namespace_state"] == 1


def test_a_cache_that_is_not_stampedes_or_a_bad_command_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="'other'.*is not django_stampede.StampedeCache"):
        stampede_command("--alias", "other", "stats")
    with pytest.raises(CommandError, match="'missing'"):
        stampede_command("--alias", "missing", "stats")
    with pytest.raises(CommandError, match="failed"):
        stampede_command("explode")
