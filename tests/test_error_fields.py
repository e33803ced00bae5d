"""A configuration error names what is at fault as data too: its ``field``,
the argument or option as stampede names it, for code that reports the error
in its own terms (the framework adapters name their settings from it)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

import stampede
import stampede.asyncio
from stampede import (
    Compressed,
    ConfigurationError,
    KeyTypeError,
    NearCache,
    Options,
    Signer,
    UnknownOptionError,
)
from stampede.testing._ports import free_port


def field_of(call: Callable[[], Any]) -> str | None:
    """The ``field`` of the ConfigurationError that ``call`` raises."""
    with pytest.raises(ConfigurationError) as raised:
        call()
    return raised.value.field


@pytest.mark.parametrize(
    ("call", "field"),
    [
        # Options: each field's own check, and the checks of two together.
        (lambda: Options(wait_timeout=-1), "wait_timeout"),
        (lambda: Options(ttl="60"), "ttl"),
        (lambda: Options(stale_ttl=float("nan")), "stale_ttl"),
        (lambda: Options(lease_ttl=0.001), "lease_ttl"),
        (lambda: Options(lease_ttl=10, max_lease_time=5), "max_lease_time"),
        (lambda: Options(on_wait_timeout="wait"), "on_wait_timeout"),
        (lambda: Options(background=1), "background"),
        (lambda: Options(beta=0), "beta"),
        (lambda: Options(unfilled_ttl=-1), "unfilled_ttl"),
        (lambda: Options(max_value_size=0), "max_value_size"),
        (lambda: Options().merged({"ttl": 2**40}), "ttl"),
        # NearCache: a field of a nested setting, after a dot.
        (lambda: NearCache(max_bytes=0), "near_cache.max_bytes"),
        (lambda: NearCache.from_setting(-1), "near_cache.max_entries"),
        (lambda: NearCache.from_setting("lots"), "near_cache"),
        # Serializers, compression and signing keys.
        (lambda: stampede.serializer_from("yaml"), "serializer"),
        (lambda: stampede.serializer_from("json+lz4"), "serializer"),
        (lambda: stampede.serializer_from("nope.Missing"), "serializer"),
        (lambda: Compressed(algorithm="lz4"), "algorithm"),
        (lambda: Compressed(min_size=-1), "min_size"),
        (lambda: Compressed(level="high"), "level"),
        (lambda: stampede.signer_from(b"short"), "signing_key"),
        (lambda: stampede.signer_from([b"k" * 16, 42], "OPTIONS['SIGNING_KEY']"), "signing_key"),
        (lambda: stampede.signer_from([]), "signing_key"),
        (lambda: Signer([b"short"]), "keys"),
        # Hooks.
        (lambda: stampede.hook_from(42, "ON_EVENT"), "on_event"),
        (lambda: stampede.hook_from("nope.missing"), "on_event"),
        # URLs, and the keywords given with them.
        (lambda: stampede.redis_client("localhost:6379"), "url"),
        (lambda: stampede.redis_client("redis+sentinel://127.0.0.1:26379"), "url"),
        (lambda: stampede.redis_client("redis+cluster://127.0.0.1:7000/3"), "url"),
        (lambda: stampede.Stampede.from_url("redis://127.0.0.1:1/0", stale_tll=5), "stale_tll"),
        (lambda: stampede.Stampede.from_url("redis://127.0.0.1:1/0", ssl_ca_certs="ca.pem"), "ssl_ca_certs"),
        # The process-wide default.
        (lambda: stampede.configure(42), "instance"),  # type: ignore[arg-type]
    ],
)
def test_each_validator_names_its_field(call: Callable[[], Any], field: str) -> None:
    assert field_of(call) == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"namespace": "a{b"}, "namespace"),
        ({"namespace": ""}, "namespace"),
        ({"tag_check_interval": -1}, "tag_check_interval"),
        ({"background_workers": 0}, "background_workers"),
        ({"stale_tll": 5}, "stale_tll"),
        ({"wait_timeout": -1}, "wait_timeout"),
        ({"options": {"ttl": 5}}, "options"),
        ({"serializer": "json"}, "serializer"),
        ({"serializer": object()}, "serializer"),
        ({"compress_above": -1}, "compress_above"),
        ({"on_event": "print"}, "on_event"),
        ({"near_cache": 0}, "near_cache"),
    ],
)
def test_stampede_names_its_keyword(client: redis.Redis, kwargs: dict[str, Any], field: str) -> None:
    assert field_of(lambda: stampede.Stampede(client, **kwargs)) == field


def test_the_clients_are_named_as_arguments(client: redis.Redis, redis_url: str) -> None:
    decoding = redis.Redis.from_url(redis_url, decode_responses=True)
    other_flavour = redis.asyncio.Redis.from_url(redis_url)
    assert field_of(lambda: stampede.Stampede(decoding)) == "client"
    assert field_of(lambda: stampede.Stampede(other_flavour)) == "client"
    assert field_of(lambda: stampede.Stampede(client, replicas=[other_flavour])) == "replicas"
    assert field_of(lambda: stampede.asyncio.Stampede(client)) == "client"
    decoding.close()


def test_keys_tags_and_decorators_name_their_argument(sf: stampede.Stampede) -> None:
    with pytest.raises(KeyTypeError) as raised:
        sf.get(42)  # type: ignore[arg-type]
    assert raised.value.field == "key"
    assert field_of(lambda: sf.get("")) == "key"
    assert field_of(lambda: sf.set("k", 1, tags="one")) == "tags"  # type: ignore[arg-type]
    assert field_of(lambda: sf.set("k", 1, tags=[""])) == "tags"
    assert field_of(lambda: sf.invalidate_tags(42)) == "tags"  # type: ignore[arg-type]
    assert field_of(lambda: sf.cached(key="")(len)) == "key"

    async def asynchronous() -> None: ...

    assert field_of(lambda: sf.cached()(asynchronous)) == "func"


def test_the_calls_name_their_argument(sf: stampede.Stampede) -> None:
    assert field_of(lambda: sf.get_or_rebuild("k", "not callable")) == "rebuild"  # type: ignore[arg-type]
    assert field_of(lambda: sf.get_or_rebuild_many(["k"], "no")) == "rebuild_many"  # type: ignore[arg-type]
    assert field_of(lambda: sf.get_or_rebuild_many(["k"], lambda keys: list(keys))) == "rebuild_many"
    assert field_of(lambda: sf.commit("not a lease", 1)) == "lease"  # type: ignore[arg-type]
    assert field_of(lambda: sf.read("k", scope="request")) == "scope"  # type: ignore[arg-type]
    assert field_of(lambda: sf.incr("k", 1.5)) == "delta"  # type: ignore[arg-type]
    assert field_of(lambda: sf.set_many([("k", 1)])) == "mapping"  # type: ignore[arg-type]
    assert field_of(lambda: sf.delete_prefix("")) == "prefix"


def test_an_unknown_option_carries_its_name() -> None:
    with pytest.raises(UnknownOptionError) as raised:
        Options(wait_timout=1)  # type: ignore[call-arg]
    assert raised.value.field == "wait_timout"
    with pytest.raises(UnknownOptionError) as raised:
        Options.from_mapping({"zz": 1, "aa": 2})
    assert raised.value.field == "aa"  # the first of several, in sorted order
    with pytest.raises(UnknownOptionError) as raised:
        Options().merged({"fail_open": True})
    assert raised.value.field == "fail_open"


def test_an_unknown_keyword_of_a_call_carries_its_name(sf: stampede.Stampede) -> None:
    with pytest.raises(UnknownOptionError) as raised:
        sf.get_or_rebuild("k", lambda: 1, stale_tll=5)  # type: ignore[call-arg]
    assert raised.value.field == "stale_tll"


def test_field_is_none_by_default_and_survives_pickling() -> None:
    assert ConfigurationError("no one argument").field is None
    error = pickle.loads(pickle.dumps(ConfigurationError("bad", field="wait_timeout")))
    assert (str(error), error.field) == ("bad", "wait_timeout")
    unknown = pickle.loads(pickle.dumps(UnknownOptionError("unknown", field="wait_timout")))
    assert isinstance(unknown, TypeError)
    assert unknown.field == "wait_timout"


# --- what a URL names ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://127.0.0.1:6379/0", "server"),
        ("rediss://user:pw@host:6380/1", "server"),
        ("unix:///tmp/redis.sock", "server"),
        ("redis+cluster://a:7000,b:7001", "cluster"),
        ("rediss+cluster://a:7000", "cluster"),
        ("REDIS+CLUSTER://a:7000", "cluster"),  # schemes are read in any case, as redis-py reads them
        ("redis+sentinel://a:26379/mymaster/0", "sentinel"),
        ("rediss+sentinel://a:26379/mymaster", "sentinel"),
        ("http://example.com", None),
        ("localhost:6379", None),
        (" redis://h:1/0", None),
        (42, None),
        (None, None),
    ],
)
def test_redis_url_kind(url: object, kind: str | None) -> None:
    assert stampede.redis_url_kind(url) == kind


# --- connection options a client's connections do not take ------------------------------


def test_a_connection_option_refused_is_named_before_any_command() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    client = redis.Redis.from_url(url, ssl_ca_certs="/etc/ssl/ca.pem")
    with pytest.raises(UnknownOptionError) as raised:
        stampede.check_connection_options(client, url)
    assert raised.value.field == "ssl_ca_certs"
    assert str(raised.value) == (
        f"ssl_ca_certs is not taken by Connection, the connection class for {url!r}; ssl_* options "
        "configure TLS: use a rediss:// URL"
    )
    client.close()


async def test_connection_options_the_connections_take_pass(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=3, client_name="checked")
    stampede.check_connection_options(client, redis_url)  # makes a connection, connects nothing
    await client.aclose()


def test_a_keyword_the_client_class_refuses_is_named() -> None:
    url = "redis+cluster://127.0.0.1:7000"
    with pytest.raises(UnknownOptionError) as raised:
        stampede.asyncio.redis_client(url, single_connection_client=True)
    assert raised.value.field == "single_connection_client"
    assert "not taken by RedisCluster, the redis-py client class" in str(raised.value)
