"""A least-privilege Redis user: the ACL the documentation gives (docs/deployment.md,
read from there, so the two cannot part) is enough for every entry point, and the
namespace is all it can reach."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import stampede
import stampede._core.near
import stampede.asyncio
from stampede.testing import RedisServer
from tests.drivers import DRIVERS
from tests.helpers import AsyncRebuilds, Rebuilds, past_the_coherence_bound, run_threads, wait_until

#: The page that gives the ACL line and what to add to it.
DEPLOYMENT = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"


def _documented_acl() -> str:
    """The documented line (Redis 6.2 and later; sharded pub/sub, on Redis 7+ and
    Valkey clusters, adds +spublish +ssubscribe +sunsubscribe), for namespace "app",
    with the test's password."""
    text = DEPLOYMENT.read_text(encoding="utf-8")
    block = text.split("```text\nACL SETUSER app ", 1)[1].split("```", 1)[0]
    return "ACL SETUSER app " + " ".join(block.split()).replace(">password", ">app-password")


ACL = _documented_acl()


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        admin = redis.Redis(port=server.port)
        admin.execute_command(*ACL.split())
        admin.close()
        yield server


@pytest.fixture
def url(acl_server: RedisServer) -> str:
    return f"redis://app:app-password@127.0.0.1:{acl_server.port}/0"


@pytest.fixture
def denied(acl_server: RedisServer) -> Iterator[list[Any]]:
    """The server's ACL LOG entries made during the test: there must be none."""
    admin = redis.Redis(port=acl_server.port)
    admin.execute_command("ACL", "LOG", "RESET")
    entries: list[Any] = []
    yield entries
    # redis-py sends CLIENT SETINFO on connect (Redis 7.2+) and ignores a refusal.
    logged = admin.execute_command("ACL", "LOG")
    entries.extend(entry for entry in logged if not entry[b"object"].startswith(b"client"))
    admin.close()
    assert entries == [], f"commands refused to the ACL user: {entries}"


def exercise(sf: Any, other: Any) -> None:
    """Every operation of the core's API, as the ACL user; ``other``, a second
    instance (another process, as far as Redis knows), waits for the rebuild
    through its subscriber."""
    rebuilds = Rebuilds(delay=0.3)
    instances = [sf, other]
    calls = iter(range(8))
    got = run_threads(8, lambda: instances[next(calls) % 2].get_or_rebuild("cold", rebuilds, ttl=60))
    assert got == ["v1"] * 8
    assert rebuilds.count == 1
    sf.set("k", "v", ttl=60)
    assert sf.get("k").value == "v"
    assert sf.get_many(["k", "cold", "nope"]) == {"k": "v", "cold": "v1"}
    assert sf.add("k", "x", ttl=60) is False
    assert sf.has_key("k") is True
    assert sf.touch("k", ttl=120) is True
    assert sf.invalidate("k") is True
    sf.set("n", 1, ttl=60)
    assert sf.incr("n", 2) == 3
    read = sf.read("leased", ttl=60)
    sf.commit(read.lease, "committed")
    assert sf.get("leased").value == "committed"
    assert sf.delete("k") is True
    assert sf.delete_prefix("n") == 1
    assert sf.clear() >= 2


@pytest.mark.parametrize("signed", [False, True])
def test_the_core_needs_nothing_more(url: str, denied: list[Any], signed: bool) -> None:
    key = b"an-acl-test-signing-key" if signed else None
    sf = stampede.Stampede.from_url(url, namespace="app", signing_key=key)
    other = stampede.Stampede.from_url(url, namespace="app", signing_key=key)
    try:
        exercise(sf, other)
    finally:
        sf.close()
        other.close()


def test_asyncio_needs_nothing_more(url: str, denied: list[Any]) -> None:
    async def main() -> None:
        sf = stampede.asyncio.Stampede.from_url(url, namespace="app")
        other = stampede.asyncio.Stampede.from_url(url, namespace="app")  # waits through its subscriber
        try:
            rebuilds = AsyncRebuilds(delay=0.3)
            got = await asyncio.gather(
                *((sf, other)[n % 2].get_or_rebuild("cold", rebuilds, ttl=60) for n in range(50))
            )
            assert set(got) == {"v1"}
            assert rebuilds.count == 1
            await sf.set("k", "v", ttl=60)
            assert (await sf.get_many(["k"])) == {"k": "v"}
            await sf.set("n", 1, ttl=60)
            assert await sf.incr("n") == 2
            assert await sf.invalidate("k") is True
            assert await sf.delete_prefix("n") == 1
            assert await sf.clear() >= 2
        finally:
            await sf.aclose()
            await other.aclose()

    asyncio.run(main())


def test_django_needs_nothing_more(url: str, denied: list[Any]) -> None:
    from django_stampede import StampedeCache

    cache = StampedeCache(url, {"OPTIONS": {"NAMESPACE": "app"}})
    assert cache.get_or_set("page", "rendered", 60) == "rendered"
    cache.set_many({"a": 1, "b": 2}, 60)
    assert cache.get_many(["a", "b"]) == {"a": 1, "b": 2}
    assert cache.incr("a") == 2
    assert cache.touch("b", 100) is True
    assert asyncio.run(cache.aget("page")) == "rendered"
    cache.delete_many(["a", "b"])
    cache.clear()
    cache.close()


def test_flask_needs_nothing_more(url: str, denied: list[Any]) -> None:
    from tests.flask_stampede.app import make_app

    app, ext, cache, _ = make_app(
        SECRET_KEY="an-acl-test-secret",
        STAMPEDE_REDIS_URL=url,
        STAMPEDE_NAMESPACE="app",
        CACHE_REDIS_URL=url,
        CACHE_OPTIONS={"namespace": "app", "stale_ttl": 30},
    )
    web = app.test_client()
    assert web.get("/page").text == web.get("/page").text
    assert web.get("/flask-caching").status_code == 200
    with app.app_context():
        cache.set("k", "v")
        assert cache.get("k") == "v"
        assert cache.has("k")
        assert cache.cache.inc("n") == 1
        cache.clear()


#: What the documentation adds to the line for the near cache: tracking on the
#: subscriber's connection, and (RESP2) its invalidation channel.
NEAR_CACHE_ACL = " +client|id +client|tracking &__redis__:invalidate"


@pytest.mark.parametrize("protocol", [3, 2], ids=["resp3", "resp2"])
@pytest.mark.parametrize("driver", ["sync", "asyncio"])
def test_a_near_cache_needs_only_the_documented_additions(protocol: int, driver: str) -> None:
    with RedisServer() as server, redis.Redis(port=server.port) as admin:
        admin.execute_command(*(ACL + NEAR_CACHE_ACL).split())
        url = f"redis://app:app-password@127.0.0.1:{server.port}/0"
        reader = DRIVERS[driver](url, redis_options={"protocol": protocol}, namespace="app", near_cache=10)
        writer = DRIVERS["sync"](url, namespace="app")
        try:
            wait_until(lambda: reader._near.live)
            for i in range(20):
                writer.set("k", i, ttl=60)
                assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == i

            def kept() -> bool:
                return bool(reader.get_or_rebuild("k", Rebuilds(), ttl=60) == 19 and len(reader._near) == 1)

            wait_until(kept)
            hits = reader._near.counts["hits"]
            assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == 19
            assert reader._near.counts["hits"] == hits + 1
        finally:
            reader.close()
            writer.close()
        logged = admin.execute_command("ACL", "LOG")
        # CLIENT SETINFO, sent by redis-py on connect: "client" on Redis 6.2.
        refused = [entry for entry in logged if entry[b"object"] not in (b"client", b"client|setinfo")]
        assert refused == [], f"commands refused to the ACL user: {refused}"


@pytest.mark.parametrize("driver", ["sync", "asyncio"])
def test_a_near_cache_the_acl_refuses_is_off_with_one_warning_and_wakeups_go_on(
    driver: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stampede._core.near, "REFUSED_RETRY_SECONDS", 0.5)
    caplog.set_level(logging.INFO, logger="stampede")
    with RedisServer() as server, redis.Redis(port=server.port) as admin:
        admin.execute_command(*ACL.split())  # without the near cache's additions
        url = f"redis://app:app-password@127.0.0.1:{server.port}/0"
        reader = DRIVERS[driver](url, namespace="app", near_cache=10)
        writer = DRIVERS["sync"](url, namespace="app")

        def told(words: str) -> int:
            return sum(words in record.getMessage() for record in caplog.records)

        try:
            assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == "v1"
            wait_until(lambda: told("near cache off: Redis refused CLIENT TRACKING") >= 1)
            # A waiter is still woken through the subscriber: its channel is
            # subscribed while the writer's rebuild holds the lease.
            rebuilds = Rebuilds(delay=1.0)
            holder = threading.Thread(
                target=writer.get_or_rebuild, args=("cold", rebuilds), kwargs={"ttl": 60}
            )
            holder.start()
            wait_until(lambda: rebuilds.count == 1)
            waiter = threading.Thread(
                target=reader.get_or_rebuild, args=("cold", Rebuilds()), kwargs={"ttl": 60}
            )
            waiter.start()
            wait_until(lambda: any(not c.startswith(b"stampede:") for c in admin.pubsub_channels()))
            holder.join(10)
            waiter.join(10)
            assert rebuilds.count == 1
            for i in range(5):  # every read asks Redis, and sees each write
                writer.set("k", i, ttl=60)
                assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == i
            assert reader._near.counts["hits"] == 0
            assert told("near cache off") == 1  # asked again, refused again, not said again
            # Granted: tracking is asked for again, without a restart.
            admin.execute_command(*f"ACL SETUSER app{NEAR_CACHE_ACL}".split())
            wait_until(lambda: reader._near.live)
            assert told("near cache on: Redis accepted CLIENT TRACKING") == 1
            wait_until(
                lambda: reader.get_or_rebuild("k", Rebuilds(), ttl=60) == 4
                and reader._near.counts["hits"] > 0
            )
            writer.set("k", 5, ttl=60)
            past_the_coherence_bound()
            assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == 5
        finally:
            reader.close()
            writer.close()


def test_outside_the_namespace_the_user_is_refused(url: str) -> None:
    sf = stampede.Stampede.from_url(url, namespace="other")
    try:
        with pytest.raises(stampede.ConfigurationError, match="NOPERM"):
            sf.set("k", "v", ttl=60)
    finally:
        sf.close()
    client = redis.Redis.from_url(url)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.get("app:session:42")  # a neighbour's key next to the namespace
    client.close()


#: What a cluster adds to the line above: the slot map, reads from replicas
#: during a failover, and sharded pub/sub where the servers have it.
CLUSTER_ACL = " +cluster|slots +cluster|shards +readonly +command"
SHARDED_ACL = " +spublish +ssubscribe +sunsubscribe"


@pytest.mark.slow
def test_a_cluster_needs_only_the_documented_additions(cluster: Any) -> None:
    sharded = False
    for node in cluster.nodes:
        admin = redis.Redis(port=node.port)
        version = admin.info("server").get("redis_version", "0")
        sharded = "valkey_version" in admin.info("server") or int(str(version).split(".")[0]) >= 7
        line = ACL + CLUSTER_ACL + (SHARDED_ACL if sharded else "")
        admin.execute_command(*line.split())
        admin.execute_command("ACL", "LOG", "RESET")
        admin.close()
    host, port = cluster.url.split("://", 1)[1].split(",")[0].split(":")
    url = f"redis+cluster://app:app-password@{host}:{port}"
    try:
        sf = stampede.Stampede.from_url(url, namespace="app")
        other = stampede.Stampede.from_url(url, namespace="app")
        try:
            exercise(sf, other)
        finally:
            sf.close()
            other.close()
        refused = []
        for node in cluster.nodes:
            admin = redis.Redis(port=node.port)
            refused += [
                e for e in admin.execute_command("ACL", "LOG") if not e[b"object"].startswith(b"client")
            ]
            admin.close()
        assert refused == [], f"commands refused to the ACL user (sharded={sharded}): {refused}"
    finally:
        for node in cluster.nodes:
            admin = redis.Redis(port=node.port)
            admin.execute_command("ACL", "DELUSER", "app")
            admin.close()


@pytest.mark.parametrize(
    "addition", [NEAR_CACHE_ACL, CLUSTER_ACL, SHARDED_ACL], ids=["near", "cluster", "sharded"]
)
def test_the_additions_tested_are_the_documented_ones(addition: str) -> None:
    documented = " ".join(DEPLOYMENT.read_text(encoding="utf-8").replace("`", " ").split())
    assert addition.strip() in documented
