"""What the Django backend says about a setting it cannot use: the setting as
written, what was expected, and the fix."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django_stampede import StampedeCache

import stampede
import stampede.asyncio

URL = os.environ.get("STAMPEDE_TEST_REDIS_URL", "")


def refusal(options: dict[str, Any], location: Any = None) -> str:
    """The message of the ImproperlyConfigured a backend with ``options`` raises."""
    with pytest.raises(ImproperlyConfigured) as raised:
        StampedeCache(URL if location is None else location, {"OPTIONS": options})
    return str(raised.value)


# --- unknown keys: said to be unknown, with the closest known one ------------------


@pytest.mark.parametrize(
    ("key", "meant"),
    [("socket_timout", "socket_timeout"), ("STALE_TLL", "STALE_TTL"), ("max_conections", "max_connections")],
)
def test_a_misspelt_option_is_unknown_and_the_close_match_is_suggested(key: str, meant: str) -> None:
    message = refusal({key: 1})
    assert message.startswith(f"django_stampede: OPTIONS[{key!r}] is not a known option: neither")
    assert f"Did you mean OPTIONS[{meant!r}]?" in message
    assert "go in lower case" not in message  # the old advice, wrong for a key already in lower case
    # Where the known ones are described.
    assert "django_stampede.StampedeCache" in message
    assert "https://redis.readthedocs.io/en/stable/connections.html" in message


def test_a_key_nothing_is_close_to_gets_no_suggestion() -> None:
    message = refusal({"zzzz": 1})
    assert "OPTIONS['zzzz'] is not a known option" in message
    assert "Did you mean" not in message


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("stale_ttl", "OPTIONS['stale_ttl'] is stampede's STALE_TTL, and stampede's options go in capitals"),
        ("Namespace", "OPTIONS['Namespace'] is stampede's NAMESPACE"),
        (
            "SOCKET_TIMEOUT",
            "OPTIONS['SOCKET_TIMEOUT'] is redis-py's socket_timeout, and redis-py's connection",
        ),
        ("TTL", "OPTIONS['TTL'] is not an option: how long values stay fresh is the cache's TIMEOUT"),
        ("host", "OPTIONS['host'] is given by LOCATION"),
        ("decode_responses", "OPTIONS['decode_responses'] cannot be set: stampede stores binary"),
        (7, "OPTIONS[7] is not a known option: OPTIONS keys are strings"),
    ],
)
def test_a_key_in_the_wrong_case_or_place_says_where_it_goes(key: Any, message: str) -> None:
    assert message in refusal({key: 1})


# --- the class options: named as written --------------------------------------------


@pytest.mark.parametrize(
    "location", ["redis+cluster://127.0.0.1:7000", "redis+sentinel://127.0.0.1:26379/mymaster/0"]
)
def test_pool_class_is_named_as_written(location: str) -> None:
    message = refusal({"pool_class": "redis.BlockingConnectionPool"}, location)
    assert "OPTIONS['pool_class'] cannot be used with a cluster or Sentinel LOCATION" in message
    assert "POOL_CLASS" not in message


@pytest.mark.parametrize("key", ["pool_class", "connection_class", "parser_class"])
def test_a_class_option_that_is_no_class_is_named(key: str) -> None:
    # Was a bare AttributeError ('int' object has no attribute 'from_url') for
    # pool_class, and a TypeError at the first command for the others.
    assert f"OPTIONS[{key!r}] must be a class or its dotted path, got 42" in refusal({key: 42})


def test_the_options_of_the_pool_class_named_are_taken() -> None:
    cache = StampedeCache(URL, {"OPTIONS": {"pool_class": "redis.BlockingConnectionPool", "timeout": 3}})
    assert cache.stampede.client.connection_pool.timeout == 3


def test_an_option_the_locations_connections_do_not_take_is_named_before_any_command() -> None:
    # Was a bare TypeError (unexpected keyword argument) at the first command.
    message = refusal({"ssl_ca_certs": "/etc/ssl/ca.pem"})
    assert "OPTIONS['ssl_ca_certs'] is not taken by Connection, the connection class for LOCATION" in message
    assert "use a rediss:// LOCATION" in message


@pytest.mark.parametrize("key", ["NAMESPACE", "TAG_CHECK_INTERVAL", "COMPRESS_ABOVE"])
def test_an_unhashable_setting_is_named_not_a_bare_type_error(key: str) -> None:
    # Was TypeError: unhashable type: 'list', from the registry of shared cores.
    assert f"OPTIONS[{key!r}] is invalid: it must be " in refusal({key: [1]})


# --- the serializer -------------------------------------------------------------------


def test_an_unknown_serializer_names_the_setting_and_the_valid_names() -> None:
    message = refusal({"SERIALIZER": "yaml"})
    assert message.startswith("django_stampede: OPTIONS['SERIALIZER'] is invalid: ")
    assert "pickle" in message  # the core's list of the names it knows, kept whole


# --- SECRET_KEY -------------------------------------------------------------------------


def test_an_empty_secret_key_is_answered_in_terms_of_signing() -> None:
    backend = {"BACKEND": "django_stampede.StampedeCache", "LOCATION": URL}
    with override_settings(SECRET_KEY="", CACHES={"default": backend}):
        with pytest.raises(ImproperlyConfigured) as raised:
            caches["default"]  # the backend is made at its first use
    message = str(raised.value)
    assert "StampedeCache signs the values it stores with a key derived from SECRET_KEY" in message
    assert "SECRET_KEY is empty: set SECRET_KEY, or give the cache OPTIONS['SIGNING_KEY']" in message
    assert "or None to store values unsigned" in message
    assert "must not be empty" not in message  # Django's own, which said nothing of signing


def test_without_a_secret_key_a_signing_key_or_none_will_do(namespace: str) -> None:
    with override_settings(SECRET_KEY=""):
        for signing_key in ("a-signing-key-of-32-characters-0", None):
            cache = StampedeCache(URL, {"OPTIONS": {"NAMESPACE": namespace, "SIGNING_KEY": signing_key}})
            cache.set("k", signing_key, 60)
            assert cache.get("k") == signing_key


# --- astampede --------------------------------------------------------------------------


def test_astampede_outside_an_event_loop_says_it_is_for_async_code() -> None:
    cache = StampedeCache(URL, {})
    with pytest.raises(stampede.ConfigurationError) as raised:
        cache.astampede  # noqa: B018
    message = str(raised.value)
    assert "cache.astampede is the asyncio core, for async views" in message
    assert "in sync code use cache.stampede" in message
    assert isinstance(cache.stampede, stampede.Stampede)  # the one to use here


def test_astampede_on_an_event_loop_is_that_loops_core(namespace: str) -> None:
    cache = StampedeCache(URL, {"OPTIONS": {"NAMESPACE": namespace}})

    async def use() -> None:
        core = cache.astampede
        assert isinstance(core, stampede.asyncio.Stampede)
        assert core is cache.astampede
        assert await core.get_or_rebuild(cache.make_key("k"), lambda: "built", ttl=60) == "built"
        await core.aclose()
        await core.client.aclose()

    asyncio.run(use())
    assert cache.get("k") == "built"
