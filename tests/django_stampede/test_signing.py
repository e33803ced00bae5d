"""The Django backend signs values by default, with a key derived from SECRET_KEY."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django_stampede import StampedeCache

from tests.helpers import RAN, plant_pickle

URL = os.environ.get("STAMPEDE_TEST_REDIS_URL", "")


def backend(namespace: str, **options: Any) -> StampedeCache:
    return StampedeCache(URL, {"OPTIONS": {"NAMESPACE": namespace, **options}})


def plant(client: redis.Redis, cache: StampedeCache, namespace: str, key: str) -> None:
    """Overwrite what ``cache`` stored under ``key`` with a pickle that runs code."""
    cache.set(key, "genuine", 60)
    (name,) = [name for name in client.keys(f"{namespace}:*") if b"}" not in name]
    plant_pickle(client, name)


def test_default_settings_never_load_a_planted_value(client: redis.Redis, namespace: str) -> None:
    cache = backend(namespace)
    plant(client, cache, namespace, "page")
    assert cache.get("page", "default") == "default"
    assert asyncio.run(cache.aget("page", "default")) == "default"
    assert cache.get_many(["page"]) == {}
    assert cache.get_or_set("page", "rebuilt", 60) == "rebuilt"
    assert cache.get("page") == "rebuilt"


def test_signing_key_none_turns_signing_off(client: redis.Redis, namespace: str) -> None:
    cache = backend(namespace, SIGNING_KEY=None)
    plant(client, cache, namespace, "page")
    cache.get("page")
    assert RAN == ["planted"]  # what the default prevents
    RAN.clear()


def test_an_explicit_signing_key_is_used_as_given(client: redis.Redis, namespace: str) -> None:
    writer = backend(namespace, SIGNING_KEY="an-explicit-key-of-32-characters")
    writer.set("k", "v", 60)
    assert backend(namespace, SIGNING_KEY=["another-key-of-32-characters-abc"]).get("k") is None
    assert backend(namespace, SIGNING_KEY=b"an-explicit-key-of-32-characters").get("k") == "v"
    assert backend(namespace).get("k") is None  # the SECRET_KEY-derived key is another


def test_values_survive_a_secret_key_rotation_with_fallbacks(namespace: str) -> None:
    old, new = "the-old-secret-key-" + "o" * 30, "the-new-secret-key-" + "n" * 30
    with override_settings(SECRET_KEY=old):
        backend(namespace).set("k", "written under the old key", 60)
    with override_settings(SECRET_KEY=new, SECRET_KEY_FALLBACKS=[old]):
        rotated = backend(namespace)
        assert rotated.get("k") == "written under the old key"
        rotated.set("k2", "written under the new key", 60)
    with override_settings(SECRET_KEY=new, SECRET_KEY_FALLBACKS=[]):
        assert backend(namespace).get("k") is None  # the fallback dropped: old values are misses
        assert backend(namespace).get("k2") == "written under the new key"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("short", r"^django_stampede: OPTIONS\['SIGNING_KEY'\] holds a 5-byte key: .*at least 16 bytes"),
        (42, r"^django_stampede: OPTIONS\['SIGNING_KEY'\] must be bytes or str"),
    ],
)
def test_a_bad_signing_key_names_the_option(namespace: str, setting: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        backend(namespace, SIGNING_KEY=setting)


def test_an_empty_secret_key_is_refused(namespace: str) -> None:
    with override_settings(SECRET_KEY=""), pytest.raises(ImproperlyConfigured, match="SECRET_KEY"):
        backend(namespace)
