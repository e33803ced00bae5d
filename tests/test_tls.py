"""TLS end to end: every entry point against a redis-server's TLS port, with
certificate verification on (redis-py's default for ``rediss://``).

The server is Debian's redis-server, built with TLS (see tests/tls.py); these
tests skip, saying why, where there is none. The CA, and for a server that
asks for one (``--tls-auth-clients yes``) the client's certificate, reach
redis-py through each entry point's own way of passing connection options.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import flask_stampede
import pytest
import redis
from django_stampede import StampedeCache
from flask import Flask
from flask_caching import Cache

import stampede
import stampede.asyncio
from stampede import EventKind
from tests.helpers import Rebuilds
from tests.tls import Certificates, TLSServer, make_certificates, tls_redis_server

_names = itertools.count()


def namespace() -> str:
    return f"tls{next(_names)}"


def with_query(url: str, **params: str) -> str:
    return f"{url}?{urlencode(params, quote_via=quote)}"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def binary() -> str:
    return tls_redis_server()


@pytest.fixture(scope="module")
def server(binary: str, certs: Certificates) -> Iterator[TLSServer]:
    """TLS, clients not asked for a certificate."""
    started = TLSServer(binary, certs, auth_clients=False).start()
    yield started
    started.close()


@pytest.fixture(scope="module")
def mtls_server(binary: str, certs: Certificates) -> Iterator[TLSServer]:
    """TLS, and clients must show a certificate that the CA signed."""
    started = TLSServer(binary, certs, auth_clients=True).start()
    yield started
    started.close()


@pytest.fixture(params=["ca", "client-cert"])
def secured(request: pytest.FixtureRequest, certs: Certificates) -> tuple[TLSServer, dict[str, str]]:
    """A server, and the redis-py options that connect to it: the CA (server
    verified), or the CA and a client certificate (both verified)."""
    if request.param == "ca":
        return request.getfixturevalue("server"), {"ssl_ca_certs": certs.ca}
    return request.getfixturevalue("mtls_server"), {
        "ssl_ca_certs": certs.ca,
        "ssl_certfile": certs.client_cert,
        "ssl_keyfile": certs.client_key,
    }


def admin(tls: TLSServer) -> redis.Redis:
    """A plain client on the server's plain port: to look at what the TLS clients did."""
    return redis.Redis.from_url(tls.plain_url)


def stored_keys(tls: TLSServer, ns: str) -> list[bytes]:
    with admin(tls) as client:
        return sorted(client.scan_iter(match=f"{ns}*"))


# --- from_url's keywords, without a server -------------------------------------------


@pytest.mark.parametrize("cls", [stampede.Stampede, stampede.asyncio.Stampede], ids=["sync", "asyncio"])
def test_from_url_takes_redis_py_tls_keywords(cls: Any) -> None:
    instance = cls.from_url(
        "rediss://127.0.0.1:6379/0",
        ssl_ca_certs="/ca.pem",
        ssl_certfile="/client.pem",
        ssl_keyfile="/client.key",
        ssl_cert_reqs="required",
        ttl=7,
        namespace="tls-kw",
    )
    connection_kwargs = instance.client.connection_pool.connection_kwargs
    assert connection_kwargs["ssl_ca_certs"] == "/ca.pem"
    assert connection_kwargs["ssl_certfile"] == "/client.pem"
    assert connection_kwargs["ssl_keyfile"] == "/client.key"
    assert connection_kwargs["ssl_cert_reqs"] == "required"
    assert connection_kwargs["health_check_interval"] == 30  # from_url's default, kept
    assert instance.options.ttl == 7


@pytest.mark.parametrize("cls", [stampede.Stampede, stampede.asyncio.Stampede], ids=["sync", "asyncio"])
def test_from_url_names_unknown_keywords(cls: Any) -> None:
    with pytest.raises(stampede.ConfigurationError, match=r"keyword\(s\) ssl_ca_cert:.*mean ssl_ca_certs\?"):
        cls.from_url("rediss://127.0.0.1:6379/0", ssl_ca_cert="/ca.pem")
    with pytest.raises(stampede.ConfigurationError, match=r"keyword\(s\) bogus, ttll:.*did you mean ttl\?"):
        cls.from_url("rediss://127.0.0.1:6379/0", ttll=5, bogus=1)
    with pytest.raises(stampede.ConfigurationError, match=r"ssl is given by a rediss:// URL"):
        cls.from_url("redis://127.0.0.1:6379/0", ssl=True)


@pytest.mark.parametrize("cls", [stampede.Stampede, stampede.asyncio.Stampede], ids=["sync", "asyncio"])
def test_from_url_refuses_tls_keywords_without_tls(cls: Any) -> None:
    with pytest.raises(stampede.ConfigurationError, match=r"ssl_ca_certs configure TLS.*use rediss://"):
        cls.from_url("redis://127.0.0.1:6379/0", ssl_ca_certs="/ca.pem")


# --- the core, blocking -----------------------------------------------------------------


def sync_core(tls: TLSServer, options: dict[str, str], how: str, **kwargs: Any) -> stampede.Stampede:
    """``Stampede.from_url`` with ``options`` in the URL's query or as keywords."""
    if how == "query":
        return stampede.Stampede.from_url(with_query(tls.url, **options), **kwargs)
    return stampede.Stampede.from_url(tls.url, **options, **kwargs)


@pytest.mark.parametrize("how", ["query", "keywords"])
def test_sync_round_trip(secured: tuple[TLSServer, dict[str, str]], how: str) -> None:
    tls, options = secured
    ns = namespace()
    rebuilds = Rebuilds()
    with sync_core(tls, options, how, namespace=ns) as core:
        assert core.get_or_rebuild("k", rebuilds, ttl=60) == "v1"
        assert core.get_or_rebuild("k", rebuilds, ttl=60) == "v1"
        core.set("other", {"a": 1}, ttl=60)
        assert core.get("other").value == {"a": 1}
    assert rebuilds.count == 1
    assert stored_keys(tls, ns)  # written to this server, through its TLS port


def test_sync_redis_client(secured: tuple[TLSServer, dict[str, str]]) -> None:
    tls, options = secured
    client = stampede.redis_client(tls.url, **options)
    try:
        with stampede.Stampede(client, namespace=namespace()) as core:
            assert core.get_or_rebuild("k", lambda: "made", ttl=60) == "made"
    finally:
        client.close()


def test_sync_crowd_waits_over_tls(server: TLSServer, certs: Certificates) -> None:
    # One cold key, 8 threads: 4 on instance a, 4 on b. a's first thread holds
    # the lease and rebuilds until b's callers are waiting on Redis (b's
    # subscriber connected, over TLS: the server has no other way in for it);
    # then all 8 get the one value, rebuilt once.
    ns = namespace()
    busy = threading.Event()
    waits: list[stampede.Event] = []

    def on_b_event(event: stampede.Event) -> None:
        if event.kind is EventKind.LEASE_BUSY:
            busy.set()
        elif event.kind is EventKind.WAIT:
            waits.append(event)

    release = threading.Event()
    rebuilds = Rebuilds(result=lambda n: f"value {n}")
    a = stampede.Stampede.from_url(server.url, ssl_ca_certs=certs.ca, namespace=ns)
    b = stampede.Stampede.from_url(server.url, ssl_ca_certs=certs.ca, namespace=ns, on_event=on_b_event)
    results: list[Any] = []

    def rebuild() -> str:
        value = rebuilds()
        release.wait(60)
        return str(value)

    def call(core: stampede.Stampede) -> None:
        try:
            results.append(core.get_or_rebuild("cold", rebuild, ttl=60, wait_timeout=60))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=call, args=(core,)) for core in [a] * 4 + [b] * 4]
    try:
        threads[0].start()
        assert rebuilds.started.wait(60)  # a's first thread holds the lease
        for thread in threads[1:]:
            thread.start()
        assert busy.wait(60), "b never found the lease busy"
        with admin(server) as plain:  # b subscribed to the key's channel: over TLS, its only way in
            for _ in range(600):
                if plain.pubsub_channels(f"{ns}*"):
                    break
                time.sleep(0.1)
            assert plain.pubsub_channels(f"{ns}*"), "b never subscribed to the key's channel"
        release.set()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive()
    finally:
        release.set()
        a.close()
        b.close()
    assert results == ["value 1"] * 8
    assert rebuilds.count == 1
    assert waits, "b's callers did not wait for a's rebuild"


# --- the core, asyncio ------------------------------------------------------------------


def async_core(tls: TLSServer, options: dict[str, str], how: str, **kwargs: Any) -> stampede.asyncio.Stampede:
    if how == "query":
        return stampede.asyncio.Stampede.from_url(with_query(tls.url, **options), **kwargs)
    return stampede.asyncio.Stampede.from_url(tls.url, **options, **kwargs)


@pytest.mark.parametrize("how", ["query", "keywords"])
async def test_async_round_trip(secured: tuple[TLSServer, dict[str, str]], how: str) -> None:
    tls, options = secured
    ns = namespace()
    calls = 0

    async def rebuild() -> str:
        nonlocal calls
        calls += 1
        return f"v{calls}"

    async with async_core(tls, options, how, namespace=ns) as core:
        assert await core.get_or_rebuild("k", rebuild, ttl=60) == "v1"
        assert await core.get_or_rebuild("k", rebuild, ttl=60) == "v1"
        await core.set("other", [1, 2], ttl=60)
        assert (await core.get("other")).value == [1, 2]
    assert calls == 1
    assert stored_keys(tls, ns)


async def test_async_redis_client(secured: tuple[TLSServer, dict[str, str]]) -> None:
    tls, options = secured
    client = stampede.asyncio.redis_client(tls.url, **options)
    try:
        async with stampede.asyncio.Stampede(client, namespace=namespace()) as core:
            assert await core.get_or_rebuild("k", lambda: "made", ttl=60) == "made"
    finally:
        await client.aclose()


async def test_async_crowd_waits_over_tls(server: TLSServer, certs: Certificates) -> None:
    # 50 tasks on one cold key, 25 on each of two instances; a's first task
    # rebuilds until b's tasks wait on Redis (b's subscriber on the TLS port).
    ns = namespace()
    busy = asyncio.Event()
    waits: list[stampede.Event] = []

    def on_b_event(event: stampede.Event) -> None:
        if event.kind is EventKind.LEASE_BUSY:
            busy.set()
        elif event.kind is EventKind.WAIT:
            waits.append(event)

    release = asyncio.Event()
    started = asyncio.Event()
    calls = 0

    async def rebuild() -> str:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return f"value {calls}"

    a = stampede.asyncio.Stampede.from_url(server.url, ssl_ca_certs=certs.ca, namespace=ns)
    b = stampede.asyncio.Stampede.from_url(
        server.url, ssl_ca_certs=certs.ca, namespace=ns, on_event=on_b_event
    )
    try:
        leader = asyncio.ensure_future(a.get_or_rebuild("cold", rebuild, ttl=60, wait_timeout=60))
        await asyncio.wait_for(started.wait(), 60)
        others = [
            asyncio.ensure_future(core.get_or_rebuild("cold", rebuild, ttl=60, wait_timeout=60))
            for core in [a] * 24 + [b] * 25
        ]
        await asyncio.wait_for(busy.wait(), 60)
        plain = redis.asyncio.Redis.from_url(server.plain_url)
        try:
            for _ in range(600):  # b subscribed to the key's channel: over TLS, its only way in
                if await plain.pubsub_channels(f"{ns}*"):
                    break
                await asyncio.sleep(0.1)
            assert await plain.pubsub_channels(f"{ns}*"), "b never subscribed to the key's channel"
        finally:
            await plain.aclose()
        release.set()
        results = await asyncio.wait_for(asyncio.gather(leader, *others, return_exceptions=True), 60)
    finally:
        release.set()
        await a.aclose()
        await b.aclose()
    assert results == ["value 1"] * 50
    assert calls == 1
    assert waits, "b's tasks did not wait for a's rebuild"


# --- verification is on ------------------------------------------------------------------


def test_a_ca_that_did_not_sign_the_server_is_refused(server: TLSServer, certs: Certificates) -> None:
    rebuilds = Rebuilds()
    with stampede.Stampede.from_url(server.url, ssl_ca_certs=certs.other_ca, fail_open=False) as core:
        with pytest.raises(stampede.RedisUnavailableError, match="(?i)certificate verify failed"):
            core.get_or_rebuild("k", rebuilds, ttl=60)
    assert rebuilds.count == 0


async def test_async_a_ca_that_did_not_sign_the_server_is_refused(
    server: TLSServer, certs: Certificates
) -> None:
    async with stampede.asyncio.Stampede.from_url(
        with_query(server.url, ssl_ca_certs=certs.other_ca), fail_open=False
    ) as core:
        with pytest.raises(stampede.RedisUnavailableError, match="(?i)certificate verify failed"):
            await core.get_or_rebuild("k", lambda: "never", ttl=60)


def test_no_ca_given_verifies_against_the_system_cas(server: TLSServer) -> None:
    # The test CA is in no system store: verification is on by default.
    with stampede.Stampede.from_url(server.url, fail_open=False) as core:
        with pytest.raises(stampede.RedisUnavailableError, match="(?i)certificate verify failed"):
            core.get("k")


def test_plain_redis_to_the_tls_port_fails(server: TLSServer) -> None:
    plain_to_tls = server.url.replace("rediss://", "redis://", 1)
    with stampede.Stampede.from_url(plain_to_tls, fail_open=False) as core:
        with pytest.raises(stampede.RedisUnavailableError):
            core.get_or_rebuild("k", lambda: "never", ttl=60)


@pytest.mark.parametrize("how", ["query", "keywords"])
def test_a_server_asking_for_a_client_certificate_refuses_none(
    mtls_server: TLSServer, certs: Certificates, how: str
) -> None:
    with sync_core(mtls_server, {"ssl_ca_certs": certs.ca}, how, fail_open=False) as core:
        with pytest.raises(stampede.RedisUnavailableError):
            core.get_or_rebuild("k", lambda: "never", ttl=60)


def test_a_client_certificate_from_another_ca_is_refused(
    mtls_server: TLSServer, certs: Certificates, tmp_path: Path
) -> None:
    strangers = make_certificates(tmp_path)  # signed by another CA: the server cannot verify it
    with stampede.Stampede.from_url(
        mtls_server.url,
        ssl_ca_certs=certs.ca,
        ssl_certfile=strangers.client_cert,
        ssl_keyfile=strangers.client_key,
        fail_open=False,
    ) as core:
        with pytest.raises(stampede.RedisUnavailableError):
            core.get("k")


# --- Django --------------------------------------------------------------------------------


def django_cache(tls: TLSServer, options: dict[str, str]) -> StampedeCache:
    # Lower-case OPTIONS go to redis-py's connection pool.
    return StampedeCache(tls.url, {"OPTIONS": {**options, "NAMESPACE": namespace()}})


def test_django(secured: tuple[TLSServer, dict[str, str]]) -> None:
    tls, options = secured
    cache = django_cache(tls, options)
    try:
        cache.set("a", {"x": 1}, 60)
        assert cache.get("a") == {"x": 1}
        rebuilds = Rebuilds()
        assert cache.get_or_set("b", rebuilds, 60) == "v1"
        assert cache.get_or_set("b", rebuilds, 60) == "v1"
        assert rebuilds.count == 1
        assert cache.delete("a") is True
        assert cache.get("a") is None
    finally:
        cache.stampede.client.connection_pool.disconnect()


async def test_django_async(secured: tuple[TLSServer, dict[str, str]]) -> None:
    tls, options = secured
    cache = django_cache(tls, options)
    try:
        await cache.aset("a", "async", 60)
        assert await cache.aget("a") == "async"
        assert await cache.aget_or_set("b", lambda: "made", 60) == "made"
        assert cache.get("b") == "made"  # the blocking core reads what the asyncio one wrote
    finally:
        core = cache.astampede
        await core.aclose()
        await core.client.connection_pool.disconnect()
        cache.stampede.client.connection_pool.disconnect()


# --- Flask -----------------------------------------------------------------------------------


def test_flask_extension(secured: tuple[TLSServer, dict[str, str]]) -> None:
    tls, options = secured
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY="tls-test",
        STAMPEDE_REDIS_URL=tls.url,
        STAMPEDE_REDIS_OPTIONS=options,
        STAMPEDE_NAMESPACE=namespace(),
    )
    extension = flask_stampede.Stampede(app)
    renders = Rebuilds()

    @app.get("/page")
    @extension.cached(ttl=60)
    def page() -> str:
        return f"render {renders()}"

    @app.get("/async-page")
    @extension.cached(ttl=60)
    async def async_page() -> str:
        await asyncio.sleep(0)
        return f"async render {renders()}"

    try:
        client = app.test_client()
        assert client.get("/page").text == "render v1"
        assert client.get("/page").text == "render v1"
        assert client.get("/async-page").text == "async render v2"
        assert client.get("/async-page").text == "async render v2"
        assert renders.count == 2
        with app.app_context():
            assert extension.stampede.get_or_rebuild("k", lambda: "direct", ttl=60) == "direct"
    finally:
        app.extensions["stampede"].core.client.close()


def test_flask_caching_backend(secured: tuple[TLSServer, dict[str, str]]) -> None:
    tls, options = secured
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY="tls-test",
        CACHE_TYPE="flask_stampede.StampedeCache",
        CACHE_REDIS_URL=tls.url,
        CACHE_OPTIONS={"redis_options": options, "namespace": namespace()},
    )
    cache = Cache(app)
    renders = Rebuilds()

    @cache.memoize(60)
    def expensive(n: int) -> str:
        return f"{n}: {renders()}"

    try:
        with app.app_context():
            assert cache.set("a", [1, 2, 3])
            assert cache.get("a") == [1, 2, 3]
            assert expensive(1) == "1: v1"
            assert expensive(1) == "1: v1"
            assert renders.count == 1
    finally:
        for backend in app.extensions["cache"].values():
            backend.stampede.client.close()
