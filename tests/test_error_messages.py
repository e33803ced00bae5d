"""Each mistake is answered at once, in plain words: what was wrong (named as
the user spelled it), what was expected, and the fix. A misconfiguration is
never reported as an outage, and ``fail_open`` never hides it."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
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
from stampede import ConfigurationError, Options, RedisUnavailableError
from stampede._exceptions import UnknownOptionError
from stampede._redis.errors import misconfiguration
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


# --- 1. a client of the other flavour -------------------------------------------------


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


# --- 2. an async function given to the blocking flavour --------------------------------


def test_the_blocking_cached_refuses_an_async_function_when_decorating(sf: stampede.Stampede) -> None:
    async def load_user(user_id: int) -> str:
        return f"user {user_id}"

    with pytest.raises(ConfigurationError) as raised:
        sf.cached(ttl=60)(load_user)
    message = str(raised.value)
    assert "load_user" in message
    assert "cached() of a stampede.asyncio.Stampede" in message


def test_the_blocking_get_or_rebuild_names_an_async_rebuild_function(sf: stampede.Stampede) -> None:
    async def load_page() -> str:
        return "page"

    with pytest.raises(ConfigurationError) as raised:
        sf.get_or_rebuild("page", load_page, ttl=60)  # type: ignore[arg-type]
    message = str(raised.value)
    assert "load_page" in message
    assert "returned a coroutine" in message
    assert "use stampede.asyncio.Stampede" in message
    assert sf.get("page") is None  # nothing was stored


async def test_the_asyncio_cached_takes_plain_and_async_functions(redis_url: str, namespace: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    asf = stampede.asyncio.Stampede(client, namespace=namespace)

    @asf.cached(ttl=60)
    def plain(n: int) -> int:  # run in a worker thread
        return n + 1

    @asf.cached(ttl=60)
    async def awaited(n: int) -> int:
        return n + 2

    assert await plain(1) == 2
    assert await awaited(1) == 3
    await asf.aclose()
    await client.aclose()


# --- 3. a plain client on a node of a Redis Cluster -------------------------------------


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


# --- 4. an unknown serializer name ------------------------------------------------------


def test_an_unknown_serializer_name_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigurationError) as raised:
        stampede.serializer_from("yaml")
    message = str(raised.value)
    assert message.startswith("serializer 'yaml' is not a name stampede knows: use 'pickle', 'json'")
    assert "'json+zlib'" in message
    assert "the dotted path of a stampede serializer class or instance" in message
    assert "Empty module name" not in message
    with pytest.raises(ConfigurationError, match="serializer 'json\\+lz4': the algorithm must be 'zlib' or"):
        stampede.serializer_from("json+lz4")


def test_a_serializer_name_given_to_stampede_says_how_to_read_it(client: redis.Redis) -> None:
    with pytest.raises(ConfigurationError) as raised:
        stampede.Stampede(client, serializer="json")  # type: ignore[arg-type]
    assert "serializer='json' is a name" in str(raised.value)
    assert "stampede.serializer_from('json')" in str(raised.value)


# --- 5. unknown options and keyword arguments -------------------------------------------


def test_an_unknown_option_is_named_with_the_close_match_and_the_known_ones() -> None:
    with pytest.raises(UnknownOptionError) as raised:
        Options(wait_timout=1)  # type: ignore[call-arg]
    assert isinstance(raised.value, TypeError)  # as Python's own, for code that catches that
    assert isinstance(raised.value, ConfigurationError)
    assert str(raised.value) == (
        "Options() got an unknown option 'wait_timout': did you mean wait_timeout? The options are "
        "ttl, stale_ttl, lease_ttl, max_lease_time, wait_timeout, on_wait_timeout, background, beta, "
        "fail_open, unfilled_ttl and max_value_size."
    )
    assert Options(wait_timeout=1).wait_timeout == 1.0


def test_an_unknown_option_given_to_stampede_is_named_too(client: redis.Redis) -> None:
    with pytest.raises(
        UnknownOptionError, match="^Stampede\\(\\) got an unknown option 'stale_tll': did you mean"
    ):
        stampede.Stampede(client, stale_tll=5)


@pytest.mark.parametrize(
    ("call", "method", "wrong", "right"),
    [
        (
            lambda sf: sf.get_or_rebuild("k", lambda: 1, stale_tll=5),
            "get_or_rebuild",
            "stale_tll",
            "stale_ttl",
        ),
        (lambda sf: sf.read("k", wait_timout=1), "read", "wait_timout", "wait_timeout"),
        (lambda sf: sf.get_or_rebuild_many(["k"], dict, tag=["t"]), "get_or_rebuild_many", "tag", "tags"),
        (lambda sf: sf.set("k", 1, tll=5), "set", "tll", "ttl"),
        (lambda sf: sf.add("k", 1, stale=5), "add", "stale", "stale_ttl"),
        (lambda sf: sf.touch("k", ttls=5), "touch", "ttls", "ttl"),
        (lambda sf: sf.set_many({"k": 1}, tl=5), "set_many", "tl", "ttl"),
        (lambda sf: sf.cached(keys="k"), "cached", "keys", "key"),
    ],
)
def test_an_unknown_keyword_argument_of_a_call_is_named(
    make_driver: Any, call: Callable[[Any], Any], method: str, wrong: str, right: str
) -> None:
    sf = make_driver()
    with pytest.raises(UnknownOptionError) as raised:
        call(sf)
    message = str(raised.value)
    assert message.startswith(f"{method}() got an unknown keyword argument {wrong!r}: did you mean {right}? ")
    assert "The keyword arguments it takes are ttl" in message


def test_an_instance_option_given_to_a_call_says_where_it_goes(make_driver: Any) -> None:
    sf = make_driver()
    with pytest.raises(TypeError) as raised:
        sf.get_or_rebuild("k", lambda: 1, fail_open=True)
    assert "fail_open is an option of the instance, not of a call: give it to Stampede()" in str(raised.value)


def test_a_commit_names_an_unknown_keyword_argument(sf: stampede.Stampede) -> None:
    lease = sf.read("k").lease
    assert lease is not None
    with pytest.raises(UnknownOptionError, match="^commit\\(\\) got an unknown keyword argument 'tag': did"):
        sf.commit(lease, 1, tag=["t"])  # type: ignore[call-arg]
    sf.release(lease)


@pytest.mark.slow
def test_a_type_checker_still_refuses_a_misspelt_keyword(tmp_path: Path) -> None:
    checked = tmp_path / "user_code.py"
    checked.write_text(
        textwrap.dedent(
            """
            import stampede
            import stampede.asyncio

            def use(sf: stampede.Stampede) -> None:
                sf.get_or_rebuild("k", lambda: 1, stale_ttl=5, tags=["t"])
                sf.get_or_rebuild("k", lambda: 1, stale_tll=5)
                sf.set("k", 1, tll=5)
                stampede.Options(wait_timout=1)

            async def use_asyncio(asf: stampede.asyncio.Stampede) -> None:
                await asf.read("k", wait_timout=1)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(checked)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        check=False,
    )
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    refused = [line.split('Unexpected keyword argument "', 1)[1].split('"')[0] for line in errors]
    assert refused == ["stale_tll", "tll", "wait_timout", "wait_timout"], done.stdout


# --- 6. a wrong password, an ACL that refuses -------------------------------------------


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


# --- 7. Sentinels that cannot name the master --------------------------------------------


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


@pytest.mark.parametrize("password", ["", ":s3cret@"])
def test_unreachable_sentinels_are_told_in_a_line(kind: str, password: str) -> None:
    port = free_port()
    error = _first_error(kind, f"redis+sentinel://{password}127.0.0.1:{port}/mymaster/0", wait_timeout=0.2)
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


# --- 8. settings accepted silently before ------------------------------------------------


def test_max_lease_time_below_lease_ttl_names_both(make_driver: Any) -> None:
    with pytest.raises(ConfigurationError) as raised:
        Options(lease_ttl=10, max_lease_time=5)
    assert str(raised.value).startswith("max_lease_time=5 is below lease_ttl=10: ")
    assert "raise max_lease_time to 10 or more, or lower lease_ttl" in str(raised.value)
    sf = make_driver(max_lease_time=30)
    with pytest.raises(ConfigurationError, match="^max_lease_time=30 is below lease_ttl=60: "):
        sf.get_or_rebuild("k", lambda: 1, lease_ttl=60)
    assert Options(lease_ttl=5, max_lease_time=5).max_lease_time == 5.0


@pytest.mark.parametrize("setting", [0, -3])
def test_a_near_cache_of_no_entries_is_refused_with_the_accepted_forms(
    client: redis.Redis, setting: int
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        stampede.Stampede(client, near_cache=setting)
    message = str(raised.value)
    assert message.startswith(f"near_cache={setting} is not a number of entries a near cache can keep")
    assert "None or False (no near cache, the default: leave it out), True (" in message
    assert "a stampede.NearCache" in message
    # The framework settings read 0 as off, as documented there.
    assert stampede.NearCache.from_setting(0) is None


# --- 9. a value signed, or not, unlike its reader ----------------------------------------


@pytest.mark.parametrize(("writer_key", "reader_key"), [(b"w" * 32, None), (None, b"r" * 32)])
def test_signing_disagreements_say_what_to_set(
    make_driver: Any, caplog: pytest.LogCaptureFixture, writer_key: bytes | None, reader_key: bytes | None
) -> None:
    writer, reader = make_driver(signing_key=writer_key), make_driver(signing_key=reader_key)
    writer.set("k", "written", ttl=60)
    with caplog.at_level(logging.WARNING, logger="stampede"):
        assert reader.get_or_rebuild("k", lambda: "rebuilt", ttl=60) == "rebuilt"  # a miss
    said = caplog.text
    assert "not a stampede envelope" not in said
    assert ("the value is signed" if writer_key else "the value is not signed") in said
    assert "Give every instance of the namespace the same signing_key" in said
    assert "OPTIONS['SIGNING_KEY']" in said
    assert "STAMPEDE_SIGNING_KEY" in said


# --- 10, 11. the testing helpers ---------------------------------------------------------


def test_stampede_testing_is_reachable_after_import_stampede_alone() -> None:
    code = (
        "import sys, stampede\n"
        "assert 'stampede.testing' not in sys.modules  # imported only when asked for\n"
        "print(stampede.testing.RedisServer.__name__, stampede.asyncio.Stampede.__module__)\n"
        "try:\n"
        "    stampede.nothing_of_that_name\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.splitlines() == [
        "RedisServer stampede._async.stampede",
        "module 'stampede' has no attribute 'nothing_of_that_name'",
    ]


def test_a_cluster_helper_url_is_a_cluster_url() -> None:
    helper = RedisCluster(masters=3, replicas=0)  # not started: its ports are chosen
    ports = [node.port for node in helper.nodes]
    assert helper.url == "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in ports)
    assert helper.node_url == f"redis://127.0.0.1:{ports[0]}/0"
    helper.close()


@pytest.mark.slow
def test_stampede_from_url_takes_the_cluster_helper_url(cluster: RedisCluster) -> None:
    sf = stampede.Stampede.from_url(cluster.url)
    assert isinstance(sf.client, redis.cluster.RedisCluster)
    sf.set_many({f"k{i}": i for i in range(20)}, ttl=60)  # keys on every master
    assert sf.get_many([f"k{i}" for i in range(20)]) == {f"k{i}": i for i in range(20)}
    sf.close()


# --- 12. incr on a missing key ----------------------------------------------------------


def test_incr_of_a_missing_key_is_none_and_creates_nothing(make_driver: Any) -> None:
    sf = make_driver()
    assert sf.incr("counter", 5) is None
    assert sf.get("counter") is None  # unlike INCRBY, which would have stored 5
    assert "None" in stampede.Stampede.incr.__doc__  # type: ignore[operator]
