"""Bad input gets a clear error naming the argument, key or setting."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import redis

import stampede
import stampede.asyncio
from stampede import ConfigurationError, Options, StampedeError


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("ttl", 0, "ttl must be greater than 0"),
        ("ttl", -1, "ttl must be greater than 0"),
        ("ttl", math.nan, "ttl must be finite"),
        ("ttl", math.inf, "ttl must be finite"),
        ("ttl", True, "ttl must be a number"),
        ("ttl", "60", "ttl must be a number"),
        ("stale_ttl", -1, "stale_ttl must be 0 or more"),
        ("stale_ttl", None, "stale_ttl must be a number"),
        ("lease_ttl", 0, "lease_ttl must be greater than 0"),
        ("lease_ttl", 0.001, "lease_ttl must be at least 0.01"),
        ("wait_timeout", -0.5, "wait_timeout must be 0 or more"),
        ("beta", 0, "beta must be greater than 0"),
        ("background", 1, "background must be True or False"),
    ],
)
def test_bad_call_options_name_the_argument(
    sf: stampede.Stampede, option: str, value: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        sf.get_or_rebuild("k", lambda: 1, **{option: value})
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, StampedeError)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ttl": -5}, "ttl must be greater than 0"),
        ({"on_wait_timeout": "wait"}, "on_wait_timeout must be 'rebuild' or 'raise'"),
        ({"fail_open": "yes"}, "fail_open must be True or False"),
        ({"max_lease_time": 0}, "max_lease_time must be greater than 0"),
        ({"tll": 5}, "unknown option.*tll"),
        ({"namespace": "a{b"}, "namespace must not contain"),
        ({"namespace": ""}, "namespace must be a non-empty str"),
        ({"serializer": object()}, "serializer must have codec_id"),
        ({"on_event": 42}, "on_event must be callable"),
        ({"background_workers": 0}, "background_workers must be an int"),
    ],
)
def test_bad_instance_options_name_the_setting(
    client: redis.Redis, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        stampede.Stampede(client, **options)


def test_unknown_per_call_option_is_rejected(sf: stampede.Stampede) -> None:
    with pytest.raises(TypeError, match="fail_open"):
        sf.get_or_rebuild("k", lambda: 1, fail_open=True)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="unknown option.*fail_open"):
        Options().merged({"fail_open": True})


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (42, "key must be str or bytes, got int"),
        (None, "key must be str or bytes, got NoneType"),
        ("", "key must not be empty"),
        ("x" * 70_000, "key is 70000 bytes long"),
    ],
)
def test_bad_keys_are_named(sf: stampede.Stampede, key: Any, message: str) -> None:
    for call in (
        lambda: sf.get_or_rebuild(key, lambda: 1),
        lambda: sf.get(key),
        lambda: sf.set(key, 1),
        lambda: sf.delete(key),
        lambda: sf.invalidate(key),
    ):
        with pytest.raises(ConfigurationError, match=message):
            call()


def test_rebuild_must_be_callable(sf: stampede.Stampede) -> None:
    with pytest.raises(ConfigurationError, match="rebuild must be callable"):
        sf.get_or_rebuild("k", 42)  # type: ignore[arg-type]


def test_a_client_that_decodes_responses_is_refused(redis_url: str) -> None:
    with pytest.raises(ConfigurationError, match="decode_responses"):
        stampede.Stampede(redis.Redis.from_url(redis_url, decode_responses=True))


def test_not_a_redis_client_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="redis-py client"):
        stampede.Stampede("redis://localhost")


def test_unserializable_value_in_set_names_the_key(sf: stampede.Stampede) -> None:
    with pytest.raises(stampede.SerializationError, match="'k'") as caught:
        sf.set("k", lambda: 1)
    assert caught.value.key == "k"


def test_options_are_frozen_and_normalised() -> None:
    options = Options(ttl=60, stale_ttl=5)
    assert options.ttl == 60.0
    assert isinstance(options.ttl, float)
    assert options.expire_ms == 65_000
    with pytest.raises(AttributeError):
        options.ttl = 5  # type: ignore[misc]
    assert Options(ttl=None).expire_ms is None
    assert options.merged({}) is options


def test_memoised_call_options_still_reject_what_equals_a_valid_value(sf: stampede.Stampede) -> None:
    # True == 1 and hash(True) == hash(1): a memo keyed on values alone
    # would let ttl=True through once ttl=1 had been validated.
    assert sf.get_or_rebuild("k", lambda: "v", ttl=1, background=False) == "v"
    with pytest.raises(ConfigurationError, match="ttl must be a number"):
        sf.get_or_rebuild("k", lambda: "v", ttl=True, background=False)
    with pytest.raises(ConfigurationError, match="background must be True or False"):
        sf.get_or_rebuild("k", lambda: "v", ttl=1, background=0)
    with pytest.raises(ConfigurationError, match="ttl must be a number"):
        sf.get_or_rebuild("k", lambda: "v", ttl=[1])


def test_serializer_from_a_setting() -> None:
    assert isinstance(stampede.serializer_from("json"), stampede.JsonSerializer)
    assert isinstance(stampede.serializer_from("PICKLE"), stampede.PickleSerializer)
    assert isinstance(stampede.serializer_from("stampede.JsonSerializer"), stampede.JsonSerializer)
    own = stampede.JsonSerializer()
    assert stampede.serializer_from(own) is own
    with pytest.raises(ConfigurationError, match="serializer 'nope.Nope' cannot be imported"):
        stampede.serializer_from("nope.Nope")
    with pytest.raises(ConfigurationError, match="serializer must be 'pickle', 'json'"):
        stampede.serializer_from(42)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://user:hunter2@h/1", "rediss://user:***@h/1"),
        ("redis://:hun@ter2@h/0", "redis://:***@h/0"),  # an unescaped "@" in the password
        (
            "redis+sentinel://u:hunter2@h1:26379,h2/mymaster/0",
            "redis+sentinel://u:***@h1:26379,h2/mymaster/0",
        ),
        ("redis://h:6379/0?password=hunter2&db=1", "redis://h:6379/0?password=***&db=1"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert stampede.redact_url(url) == shown


@pytest.mark.parametrize(
    "url",
    ["redis+sentinel://:hunter2@h/", "redis+cluster://:hunter2@h:7000/3", "redis+sentinel://:hunter2@h/s/x"],
)
def test_a_refused_url_is_named_without_its_password(url: str) -> None:
    with pytest.raises(stampede.ConfigurationError) as raised:
        stampede.Stampede.from_url(url)
    assert "hunter2" not in str(raised.value)
    assert "***" in str(raised.value)


@pytest.mark.parametrize("url", ["http://:hunter2@h:6379/0", "valkey://h", "REDIS+SENTINELS://h/s"])
def test_a_url_of_another_scheme_is_refused_by_name(url: str) -> None:
    for cls in (stampede.Stampede, stampede.asyncio.Stampede):
        with pytest.raises(
            stampede.ConfigurationError, match=r"url: .* is not a Redis URL scheme; use one of redis://"
        ) as raised:
            cls.from_url(url)
        assert raised.value.field == "url"
        assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize("name", ["ttl", "stale_ttl", "lease_ttl", "max_lease_time", "wait_timeout"])
def test_times_beyond_what_redis_and_python_can_hold_are_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match=f"{name} must be at most 2147483648 seconds"):
        Options(**{name: 1e18})


@pytest.mark.parametrize("key", [12345, ["user", 1]], ids=["int", "unhashable list"])
def test_a_key_of_the_wrong_type_is_a_type_error(sf: stampede.Stampede, key: Any) -> None:
    # Also with a near cache (make test-near-cache): its index is asked first.
    words = f"key must be str or bytes, got {type(key).__name__}"
    with pytest.raises(stampede.KeyTypeError, match=words):
        sf.get(key)
    with pytest.raises(stampede.KeyTypeError, match=words):
        sf.get_or_rebuild(key, lambda: 1)
    with pytest.raises(stampede.KeyTypeError, match=words):
        sf.read(key)
    assert issubclass(stampede.KeyTypeError, ConfigurationError)


def test_a_value_over_max_value_size_is_refused_before_it_is_sent(
    sf: stampede.Stampede, client: redis.Redis
) -> None:
    small = stampede.Stampede(client, namespace=sf.namespace, max_value_size=1000)
    with pytest.raises(
        stampede.SerializationError, match="'big' is .* bytes once serialized; max_value_size is 1000"
    ):
        small.set("big", os.urandom(5000))  # random: compression cannot bring it under
    rebuilds = []
    with pytest.raises(stampede.SerializationError, match="max_value_size"):
        small.get_or_rebuild("rebuilt", lambda: rebuilds.append(1) or os.urandom(5000))
    assert rebuilds == [1]
    assert small.read("rebuilt").lease is not None  # the refused rebuild's lease was released
    assert small.get_or_rebuild("fits", lambda: "x" * 10) == "x" * 10
    with pytest.raises(ConfigurationError, match="max_value_size"):
        stampede.Stampede(client, max_value_size=0)
