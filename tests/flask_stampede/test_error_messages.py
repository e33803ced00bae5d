"""What the Flask extension and the Flask-Caching backend say about a setting
they cannot use, and how the settings whose meaning was unsaid behave."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import pytest
import redis
from flask import Flask

import stampede
from tests.flask_stampede.app import make_app
from tests.helpers import RAN, plant_pickle

SECRET = "a-flask-secret-key-for-these-tests"


def refusal(**config: Any) -> str:
    """The message of the ConfigurationError an app with ``config`` gets."""
    with pytest.raises(stampede.ConfigurationError) as raised:
        make_app(**config)
    return str(raised.value)


# --- STAMPEDE_REDIS_OPTIONS and CACHE_OPTIONS["redis_options"] ------------------------


@pytest.mark.parametrize(
    ("config", "setting"),
    [
        ({"STAMPEDE_REDIS_OPTIONS": {"socket_timout": 1}}, "STAMPEDE_REDIS_OPTIONS"),
        ({"CACHE_OPTIONS": {"redis_options": {"socket_timout": 1}}}, "CACHE_OPTIONS['redis_options']"),
    ],
)
def test_a_misspelt_redis_option_is_named_with_the_close_match(config: dict[str, Any], setting: str) -> None:
    message = refusal(**config)
    # Was redis-py's "__init__() got an unexpected keyword argument 'socket_timout'".
    assert message.startswith(f"flask_stampede: {setting}['socket_timout'] is not a known option.")
    assert "Did you mean 'socket_timeout'?" in message
    assert f"{setting} holds redis-py's connection keyword arguments" in message
    assert "unexpected keyword argument" not in message


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"STAMPEDE_REDIS_OPTIONS": {"stale_ttl": 5}},
            "STAMPEDE_REDIS_OPTIONS['stale_ttl'] is one of stampede's options, not redis-py's: "
            "set STAMPEDE_STALE_TTL",
        ),
        (
            {"CACHE_OPTIONS": {"redis_options": {"stale_ttl": 5}}},
            "CACHE_OPTIONS['redis_options']['stale_ttl'] is one of stampede's options, not redis-py's: "
            "set CACHE_OPTIONS['stale_ttl']",
        ),
        (
            {"STAMPEDE_REDIS_OPTIONS": {"host": "h"}},
            "STAMPEDE_REDIS_OPTIONS['host'] is given by STAMPEDE_REDIS_URL",
        ),
        (
            {"STAMPEDE_REDIS_OPTIONS": {"ssl_ca_certs": "/etc/ssl/ca.pem"}},
            "STAMPEDE_REDIS_OPTIONS['ssl_ca_certs'] is not taken by Connection, the connection class for "
            "STAMPEDE_REDIS_URL",
        ),
        (
            {"CACHE_OPTIONS": {"redis_options": "socket_timeout=1"}},
            "CACHE_OPTIONS['redis_options'] must be a dict of redis-py connection keyword arguments",
        ),
        (
            {"CACHE_REDIS_URL": "redis+sentinel://127.0.0.1:26379"},
            "CACHE_REDIS_URL is invalid: a redis+sentinel:// url names the service",
        ),
    ],
)
def test_redis_settings_are_named_as_written(config: dict[str, Any], message: str) -> None:
    assert message in refusal(**config)


def test_a_misspelt_setting_gets_the_close_match() -> None:
    message = refusal(STAMPEDE_SIGNING_KYE="k" * 32)
    assert "STAMPEDE_SIGNING_KYE is not a known setting. Did you mean 'STAMPEDE_SIGNING_KEY'?" in message


def test_an_unknown_serializer_names_the_setting_and_the_valid_names() -> None:
    message = refusal(STAMPEDE_SERIALIZER="yaml")
    assert message.startswith("flask_stampede: STAMPEDE_SERIALIZER is invalid: ")
    assert "pickle" in message  # the core's list of the names it knows, kept whole


# --- CACHE_OPTIONS: what the Flask-Caching backend takes -------------------------------


def test_cache_options_take_max_value_size() -> None:
    app, _, cache, _ = make_app(CACHE_OPTIONS={"stale_ttl": 30, "max_value_size": 1000})
    with app.app_context():
        backend: Any = cache.cache
        assert backend.stampede.options.max_value_size == 1000
        with pytest.raises(stampede.SerializationError, match="1000"):
            cache.set("big", os.urandom(2000))  # random: compression cannot bring it under


@pytest.mark.parametrize(
    ("option", "why"),
    [
        ("background", "does not apply to the Flask-Caching backend: Flask-Caching computes a value"),
        ("ttl", "does not apply to the Flask-Caching backend: Flask-Caching gives the timeouts"),
    ],
)
def test_cache_options_refuse_what_does_not_apply_saying_why(option: str, why: str) -> None:
    message = refusal(CACHE_OPTIONS={option: True if option == "background" else 60})
    assert f"CACHE_OPTIONS[{option!r}] {why}" in message


def test_a_misspelt_cache_option_gets_the_close_match() -> None:
    message = refusal(CACHE_OPTIONS={"max_value_sise": 10})
    assert "CACHE_OPTIONS['max_value_sise'] is not a known option. Did you mean 'max_value_size'?" in message


# --- STAMPEDE_SIGNING_KEY: absent, None, False ----------------------------------------


def planted_one_ran(client: redis.Redis, app: Flask, ext: Any) -> bool:
    """Store a value, replace it in Redis with a pickle that runs code, read it
    back: whether the planted code ran (values are not signed)."""
    with app.app_context():
        ext.stampede.set("k", "genuine", ttl=60)
        plant_pickle(client, f"{app.config['STAMPEDE_NAMESPACE']}:{{k")
        ext.stampede.get("k")
    ran = RAN == ["planted"]
    RAN.clear()
    return ran


def test_signing_key_absent_signs_with_the_secret_key(client: redis.Redis) -> None:
    app, ext, _, _ = make_app(SECRET_KEY=SECRET)
    assert not planted_one_ran(client, app, ext)


@pytest.mark.parametrize("off", [None, False])
def test_signing_key_none_or_false_stores_unsigned_as_in_django(
    client: redis.Redis, caplog: pytest.LogCaptureFixture, off: Any
) -> None:
    with caplog.at_level(logging.WARNING, logger="flask_stampede"):
        app, ext, _, _ = make_app(SECRET_KEY=SECRET, STAMPEDE_SIGNING_KEY=off)
        without_secret, _, _, _ = make_app(STAMPEDE_SIGNING_KEY=off, CACHE_OPTIONS={"signing_key": off})
    assert planted_one_ran(client, app, ext)
    assert "not signed" not in caplog.text  # asked for: no warning, SECRET_KEY or not
    assert without_secret.extensions["stampede"]


def test_signing_key_absent_without_a_secret_key_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="flask_stampede"):
        make_app(CACHE_OPTIONS={})
    assert "STAMPEDE_SIGNING_KEY; set it to None or False" in caplog.text
    assert "CACHE_OPTIONS['signing_key']; set it to None or False" in caplog.text


# --- memoize(cache_none=...) ---------------------------------------------------------


@pytest.mark.parametrize(("cache_none", "runs"), [(False, 3), (True, 1)])
def test_memoize_stores_none_only_with_cache_none(cache_none: bool, runs: int) -> None:
    app, ext, _, _ = make_app()
    calls: list[int] = []

    @ext.memoize(ttl=60, cache_none=cache_none)
    def find(x: int) -> None:
        calls.append(x)

    @ext.memoize(ttl=60, cache_none=cache_none)
    async def afind(x: int) -> None:
        calls.append(x)

    with app.app_context():
        assert [find(1) for _ in range(3)] == [None] * 3
        assert len(calls) == runs
        calls.clear()
        for _ in range(3):
            assert asyncio.run(afind(1)) is None
        assert len(calls) == runs
