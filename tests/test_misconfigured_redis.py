"""A Redis, or a client of it, that stampede cannot use is said to be one, in
plain words: a client of the other flavour, a plain client on a node of a
Redis Cluster, a password or an ACL refused, Sentinels that cannot name the
master. A misconfiguration is never reported as an outage, and ``fail_open``
never hides it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.exceptions
import redis.sentinel

import stampede
import stampede.asyncio
from stampede import ConfigurationError, RedisUnavailableError
from stampede._protocol.errors import misconfiguration
from stampede.testing import RedisCluster, RedisSentinel, RedisServer
from stampede.testing._ports import free_port
from tests.drivers import DRIVERS
from tests.helpers import Rebuilds

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["sync", "asyncio"])
def kind(request: pytest.FixtureRequest) -> str:
    """Which flavour a test drives (through ``tests.drivers``)."""
    return str(request.param)


@pytest.fixture
def build(kind: str, namespace: str) -> Iterator[Callable[..., Any]]:
    """Makes drivers of the test's flavour on a URL of its choosing (no near
    cache, whatever the suite's options: some of these never connect)."""
    made: list[Any] = []

    def make(url: str, **kwargs: Any) -> Any:
        kwargs.setdefault("namespace", namespace)
        driver = DRIVERS[kind](url, **kwargs)
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()


# --- a client of the other flavour -----------------------------------------------------


def _closed_sentinel(module: Any) -> Any:
    """A Sentinel-managed master client of ``module`` (redis.sentinel or its
    asyncio twin); nothing connects until a command is sent."""
    return module.Sentinel([("127.0.0.1", free_port())]).master_for("mymaster")


@pytest.mark.parametrize(
    "make",
    [
        lambda url: redis.asyncio.Redis.from_url(url),
        lambda url: redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=1),
        lambda url: _closed_sentinel(redis.asyncio.sentinel),
    ],
    ids=["Redis", "RedisCluster", "Sentinel"],
)
def test_the_blocking_stampede_refuses_a_redis_asyncio_client(
    make: Callable[[str], Any], redis_url: str
) -> None:
    client = make(redis_url)
    try:
        with pytest.raises(ConfigurationError) as raised:
            stampede.Stampede(client)
        message = str(raised.value)
        assert message.startswith("client is a redis.asyncio client")
        assert "use stampede.asyncio.Stampede for redis.asyncio clients" in message
        with pytest.raises(ConfigurationError, match=r"^replicas\[0\] is a redis\.asyncio client"):
            with redis.Redis.from_url(redis_url) as primary:
                stampede.Stampede(primary, replicas=[client])
    finally:
        asyncio.run(client.aclose())


@pytest.mark.slow
def test_the_asyncio_stampede_refuses_a_blocking_client(redis_url: str, cluster: RedisCluster) -> None:
    host, port = "127.0.0.1", cluster.nodes[0].port
    clients = [
        redis.Redis.from_url(redis_url),
        redis.cluster.RedisCluster(host=host, port=port, socket_timeout=5),
        _closed_sentinel(redis.sentinel),
    ]
    try:
        for client in clients:
            with pytest.raises(ConfigurationError) as raised:
                stampede.asyncio.Stampede(client)
            message = str(raised.value)
            assert message.startswith("client is a blocking redis-py client"), message
            assert "use stampede.Stampede for blocking clients" in message
    finally:
        for client in clients:
            client.close()


async def test_clients_that_only_look_like_one_are_judged_by_their_commands(redis_url: str) -> None:
    class Wrapped:
        """A stand-in for a client wrapper: everything asked of it goes to the client."""

        def __init__(self, client: Any) -> None:
            self._client = client

        def __getattr__(self, name: str) -> Any:
            return getattr(self._client, name)

    class Subclassed(redis.asyncio.Redis):
        pass

    inner = redis.asyncio.Redis.from_url(redis_url)
    subclassed = Subclassed.from_url(redis_url)
    try:
        for client in (Wrapped(inner), subclassed):
            asf = stampede.asyncio.Stampede(client, namespace="wrapped")
            assert await asf.get_or_rebuild("k", lambda: "v", ttl=60) == "v"
            await asf.aclose()
        with pytest.raises(ConfigurationError, match="is a redis.asyncio client"):
            stampede.Stampede(Wrapped(inner))
    finally:
        await inner.aclose()
        await subclassed.aclose()


# --- a plain client on a node of a Redis Cluster ---------------------------------------


def _refused(calls: list[Callable[[], Any]]) -> list[str]:
    """Run ``calls`` (one per key, on every node); the messages of the errors
    they raised, each a ConfigurationError for the MOVED reply of another node."""
    errors: list[ConfigurationError] = []
    for call in calls:
        try:
            call()
        except ConfigurationError as exc:
            errors.append(exc)
    assert not [error for error in errors if isinstance(error, RedisUnavailableError)]
    assert all(isinstance(error.__cause__, redis.exceptions.MovedError) for error in errors)
    return [str(error) for error in errors]


@pytest.mark.slow
@pytest.mark.parametrize("fail_open", [False, True])
def test_a_plain_url_to_a_cluster_node_says_to_use_a_cluster_url(
    cluster: RedisCluster, build: Callable[..., Any], fail_open: bool
) -> None:
    driver = build(cluster.node_url, fail_open=fail_open)
    rebuilds = Rebuilds()
    keys = [f"k{i}" for i in range(20)]  # on every master
    read = _refused([lambda key=key: driver.get_or_rebuild(key, rebuilds, ttl=60) for key in keys])
    written = _refused([lambda key=key: driver.set(key, 1, ttl=60) for key in keys])
    assert read
    assert written
    for message in read + written:
        assert message.startswith("Redis refused to "), message
        assert "(MOVED " in message
        assert (
            "this node is part of a Redis Cluster: use redis+cluster://host:port (or cluster=True)" in message
        )
    # Only the keys of the node asked were rebuilt: fail_open rebuilt none of
    # the others, as a misconfiguration is not an outage.
    assert rebuilds.count == len(keys) - len(read)


@pytest.mark.parametrize(
    ("error", "cluster", "fixed"),
    [
        (redis.exceptions.MovedError("3999 127.0.0.1:7001"), False, True),
        (redis.exceptions.AskError("3999 127.0.0.1:7001"), False, True),
        (redis.exceptions.ResponseError("MOVED 3999 127.0.0.1:7001"), False, True),
        (redis.exceptions.MovedError("3999 127.0.0.1:7001"), True, False),  # a cluster client's to follow
        (redis.exceptions.ResponseError("WRONGPASS invalid username-password pair"), False, True),
        (redis.exceptions.ResponseError("NOAUTH Authentication required."), True, True),
        (redis.exceptions.ResponseError("NOPERM this user has no permissions"), False, True),
        (redis.exceptions.ConnectionError("Connection refused"), False, False),
        (redis.exceptions.ResponseError("OOM command not allowed"), False, False),
    ],
)
def test_what_is_a_misconfiguration(error: Exception, cluster: bool, fixed: bool) -> None:
    assert (misconfiguration(error, cluster=cluster, namespace="app") is not None) is fixed


# --- a wrong password, an ACL that refuses ---------------------------------------------


@pytest.fixture(scope="module")
def locked() -> Iterator[RedisServer]:
    """A server with a password, and two ACL users that lack what stampede needs."""
    with RedisServer() as server:
        admin = redis.Redis(port=server.port)
        admin.execute_command(*"ACL SETUSER noscripts on >pw ~* &* +@all -evalsha -eval".split())
        admin.execute_command(*"ACL SETUSER elsewhere on >pw ~other:* &* +@all".split())
        admin.config_set("requirepass", "secret")
        admin.close()
        yield server


@pytest.mark.parametrize("fail_open", [False, True])
@pytest.mark.parametrize(
    ("credentials", "words"),
    [
        (":wrong@", "the server refused the password: check the password"),
        ("", "the server needs a password and the client gives none: set it in the URL"),
    ],
    ids=["wrong", "missing"],
)
def test_a_password_refused_is_a_misconfiguration_even_with_fail_open(
    locked: RedisServer, build: Callable[..., Any], fail_open: bool, credentials: str, words: str
) -> None:
    driver = build(f"redis://{credentials}127.0.0.1:{locked.port}/0", fail_open=fail_open)
    rebuilds = Rebuilds()
    for call in (lambda: driver.get_or_rebuild("k", rebuilds, ttl=60), lambda: driver.set("k", 1)):
        with pytest.raises(ConfigurationError) as raised:
            call()
        assert not isinstance(raised.value, RedisUnavailableError)
        assert isinstance(raised.value.__cause__, redis.exceptions.AuthenticationError)
        message = str(raised.value)
        assert message.startswith("Redis refused to "), message
        assert words in message
        assert "redis://user:password@host:6379/0" in message
        assert "secret" not in message
        assert ":wrong@" not in message
    assert rebuilds.count == 0  # fail_open did not rebuild around it


@pytest.mark.parametrize("fail_open", [False, True])
@pytest.mark.parametrize(
    ("user", "refused"),
    [("noscripts", "'evalsha' command"), ("elsewhere", "read key 'k'")],
    ids=["command", "key"],
)
def test_an_acl_refusal_names_what_was_refused_even_with_fail_open(
    locked: RedisServer, build: Callable[..., Any], fail_open: bool, user: str, refused: str
) -> None:
    driver = build(f"redis://{user}:pw@127.0.0.1:{locked.port}/0", fail_open=fail_open, namespace="app")
    rebuilds = Rebuilds()
    with pytest.raises(ConfigurationError) as raised:
        driver.get_or_rebuild("k", rebuilds, ttl=60)
    assert not isinstance(raised.value, RedisUnavailableError)
    assert isinstance(raised.value.__cause__, redis.exceptions.NoPermissionError)
    message = str(raised.value)
    assert "NOPERM" in message
    assert refused in message
    assert "the ACL user lacks a permission that stampede needs: it may not run that command" in message
    assert "ACL GETUSER <user>" in message
    assert "~app:{* &app:{*" in message
    assert rebuilds.count == 0


# --- Sentinels that cannot name the master ---------------------------------------------


def _first_error(kind: str, url: str, **kwargs: Any) -> BaseException:
    """What ``get_or_rebuild`` raises on an instance of ``kind`` made by ``from_url(url)``."""
    if kind == "sync":
        sf = stampede.Stampede.from_url(url, **kwargs)
        try:
            with pytest.raises(RedisUnavailableError) as raised:
                sf.get_or_rebuild("k", Rebuilds(), ttl=60)
        finally:
            sf.close()
        return raised.value

    async def main() -> BaseException:
        asf = stampede.asyncio.Stampede.from_url(url, **kwargs)
        try:
            with pytest.raises(RedisUnavailableError) as raised:
                await asf.get_or_rebuild("k", Rebuilds(), ttl=60)
        finally:
            await asf.aclose()
        return raised.value

    return asyncio.run(main())


def test_unreachable_sentinels_are_told_in_a_line(kind: str) -> None:
    # With a password in the URL: the line must not carry it.
    port = free_port()
    error = _first_error(kind, f"redis+sentinel://:s3cret@127.0.0.1:{port}/mymaster/0", wait_timeout=0.2)
    message = str(error)
    assert (
        f"no master for service 'mymaster' from the Sentinels at 127.0.0.1:{port}: none of them could be "
        "reached; check the Sentinel addresses (and that they run) and the service name"
    ) in message
    assert "<redis" not in message
    assert "ConnectionPool" not in message
    assert "s3cret" not in message
    assert len(message) < 400


@pytest.mark.slow
def test_a_service_the_sentinels_do_not_know_is_told_in_a_line(sentinel: RedisSentinel, kind: str) -> None:
    url = sentinel.url.replace(f"/{sentinel.service}/", "/wrongservice/")
    message = str(_first_error(kind, url, wait_timeout=0.2))
    addresses = ", ".join(f"{host}:{port}" for host, port in sentinel.sentinel_addresses)
    assert (
        f"no master for service 'wrongservice' from the Sentinels at {addresses}: they answered, and "
        "none knows a master of that name that is up; check the Sentinel addresses"
    ) in message
    assert "the service name" in message
    assert "<redis" not in message
