"""The Django backend names the setting at fault from the ``field`` of the
error stampede raised (``OPTIONS['WAIT_TIMEOUT']`` for ``wait_timeout``), never
from its message, which it keeps whole."""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django_stampede import StampedeCache
from django_stampede._errors import improperly_configured

import stampede

URL = os.environ.get("STAMPEDE_TEST_REDIS_URL", "")


@pytest.mark.parametrize(
    ("options", "setting", "field"),
    [
        ({"WAIT_TIMEOUT": -1}, "OPTIONS['WAIT_TIMEOUT']", "wait_timeout"),
        ({"LEASE_TTL": 10, "MAX_LEASE_TIME": 5}, "OPTIONS['MAX_LEASE_TIME']", "max_lease_time"),
        ({"MAX_VALUE_SIZE": 0}, "OPTIONS['MAX_VALUE_SIZE']", "max_value_size"),
        ({"NAMESPACE": "a{b"}, "OPTIONS['NAMESPACE']", "namespace"),
        ({"TAG_CHECK_INTERVAL": 61}, "OPTIONS['TAG_CHECK_INTERVAL']", "tag_check_interval"),
        ({"NEAR_CACHE": "lots"}, "OPTIONS['NEAR_CACHE']", "near_cache"),
        ({"NEAR_CACHE": {"MAX_BYTES": 0}}, "OPTIONS['NEAR_CACHE']['MAX_BYTES']", "near_cache.max_bytes"),
        ({"SERIALIZER": "yaml"}, "OPTIONS['SERIALIZER']", "serializer"),
    ],
)
def test_the_setting_is_named_from_the_field(options: dict[str, Any], setting: str, field: str) -> None:
    with pytest.raises(ImproperlyConfigured) as raised:
        StampedeCache(URL, {"OPTIONS": {**options, "NAMESPACE": options.get("NAMESPACE", "fields")}})
    cause = raised.value.__cause__
    assert isinstance(cause, stampede.ConfigurationError)
    assert cause.field == field
    assert str(raised.value) == f"django_stampede: {setting} is invalid: {cause}"


@pytest.mark.parametrize(
    ("field", "named"),
    [
        ("wait_timeout", "OPTIONS['WAIT_TIMEOUT']"),
        ("compress_above", "OPTIONS['COMPRESS_ABOVE']"),
        ("near_cache.max_entries", "OPTIONS['NEAR_CACHE']"),
        ("client", "OPTIONS"),
        (None, "OPTIONS"),
    ],
)
def test_the_field_not_the_message_decides(field: str | None, named: str) -> None:
    # A message that starts like another setting's name, to show it is not read.
    error = stampede.ConfigurationError("namespace must be something else", field=field)
    assert str(improperly_configured(error)) == (
        f"django_stampede: {named} is invalid: namespace must be something else"
    )


def test_a_connection_option_refused_is_named_from_the_field() -> None:
    with pytest.raises(ImproperlyConfigured) as raised:
        StampedeCache(URL, {"OPTIONS": {"ssl_certfile": "/etc/ssl/client.pem"}})
    assert str(raised.value).startswith(
        "django_stampede: OPTIONS['ssl_certfile'] is not taken by Connection, the connection class for "
        "LOCATION "
    )
    assert str(raised.value).endswith("; ssl_* options configure TLS: use a rediss:// LOCATION")
