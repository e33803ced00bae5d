"""The Flask extension and the Flask-Caching backend name the setting at
fault from the ``field`` of the error stampede raised (``STAMPEDE_WAIT_TIMEOUT``,
``CACHE_OPTIONS['wait_timeout']`` for ``wait_timeout``), never from its
message, which they keep whole."""

from __future__ import annotations

from typing import Any

import pytest
from flask_stampede._config import setting_of

import stampede
from tests.flask_stampede.app import make_app


@pytest.mark.parametrize(
    ("config", "setting", "field"),
    [
        ({"STAMPEDE_WAIT_TIMEOUT": -1}, "STAMPEDE_WAIT_TIMEOUT", "wait_timeout"),
        ({"STAMPEDE_STALE_IF_ERROR": -1}, "STAMPEDE_STALE_IF_ERROR", "stale_if_error"),
        ({"STAMPEDE_ON_WAIT_TIMEOUT": "wait"}, "STAMPEDE_ON_WAIT_TIMEOUT", "on_wait_timeout"),
        ({"STAMPEDE_NAMESPACE": "a{b"}, "STAMPEDE_NAMESPACE", "namespace"),
        ({"STAMPEDE_TAG_CHECK_INTERVAL": -1}, "STAMPEDE_TAG_CHECK_INTERVAL", "tag_check_interval"),
        ({"STAMPEDE_NEAR_CACHE": "lots"}, "STAMPEDE_NEAR_CACHE", "near_cache"),
        (
            {"STAMPEDE_NEAR_CACHE": {"max_value_bytes": 0}},
            "STAMPEDE_NEAR_CACHE['max_value_bytes']",
            "near_cache.max_value_bytes",
        ),
        ({"STAMPEDE_REDIS_OPTIONS": {"decode_responses": True}}, "STAMPEDE_REDIS_OPTIONS", "client"),
        ({"STAMPEDE_REDIS_URL": "redis+sentinel://127.0.0.1:26379"}, "STAMPEDE_REDIS_URL", "url"),
        ({"CACHE_OPTIONS": {"stale_ttl": -1}}, "CACHE_OPTIONS['stale_ttl']", "stale_ttl"),
        ({"CACHE_OPTIONS": {"stale_if_error": -1}}, "CACHE_OPTIONS['stale_if_error']", "stale_if_error"),
        ({"CACHE_OPTIONS": {"namespace": "a{b"}}, "CACHE_OPTIONS['namespace']", "namespace"),
        (
            {"CACHE_OPTIONS": {"near_cache": {"max_entries": -1}}},
            "CACHE_OPTIONS['near_cache']['max_entries']",
            "near_cache.max_entries",
        ),
        (
            {"CACHE_OPTIONS": {"redis_options": {"decode_responses": True}}},
            "CACHE_OPTIONS['redis_options']",
            "client",
        ),
    ],
)
def test_the_setting_is_named_from_the_field(config: dict[str, Any], setting: str, field: str) -> None:
    if "CACHE_OPTIONS" in config:
        config = {"CACHE_OPTIONS": {"namespace": "fields", **config["CACHE_OPTIONS"]}}
    with pytest.raises(stampede.ConfigurationError) as raised:
        make_app(**config)
    cause = raised.value.__cause__
    assert isinstance(cause, stampede.ConfigurationError)
    assert cause.field == field
    assert str(raised.value) == f"flask_stampede: {setting} is invalid: {cause}"


@pytest.mark.parametrize(
    ("field", "named"),
    [
        ("wait_timeout", "STAMPEDE_WAIT_TIMEOUT"),
        ("compress_above", "STAMPEDE_COMPRESS_ABOVE"),
        ("near_cache.max_entries", "STAMPEDE_NEAR_CACHE"),
        ("client", "the default"),
        (None, "the default"),
    ],
)
def test_the_field_not_the_message_decides(field: str | None, named: str) -> None:
    # A message that starts like another setting's name, to show it is not read.
    error = stampede.ConfigurationError("namespace must be something else", field=field)
    assert setting_of(error, "the default") == named


def test_a_connection_option_refused_is_named_from_the_field() -> None:
    with pytest.raises(stampede.ConfigurationError) as raised:
        make_app(STAMPEDE_REDIS_OPTIONS={"ssl_certfile": "/etc/ssl/client.pem"})
    message = str(raised.value)
    assert message.startswith(
        "flask_stampede: STAMPEDE_REDIS_OPTIONS['ssl_certfile'] is not taken by Connection, the "
        "connection class for STAMPEDE_REDIS_URL "
    )
    assert message.endswith("; ssl_* options configure TLS: use a rediss:// URL")
