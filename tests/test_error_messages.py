"""Each mistake in a call, an argument or an option is answered at once, in
plain words: what was wrong (named as the user spelled it), what was
expected, and the fix."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
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
from stampede import ConfigurationError, Options
from stampede._exceptions import UnknownOptionError
from stampede.testing import RedisCluster

ROOT = Path(__file__).resolve().parent.parent


# --- an async function given to the blocking flavour -----------------------------------


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


# --- an unknown serializer name --------------------------------------------------------


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


# --- unknown options and keyword arguments ---------------------------------------------


def test_an_unknown_option_is_named_with_the_close_match_and_the_known_ones() -> None:
    with pytest.raises(UnknownOptionError) as raised:
        Options(wait_timout=1)  # type: ignore[call-arg]
    assert isinstance(raised.value, TypeError)  # as Python's own, for code that catches that
    assert isinstance(raised.value, ConfigurationError)
    assert str(raised.value) == (
        "Options() got an unknown option 'wait_timout': did you mean wait_timeout? The options are "
        "ttl, stale_ttl, stale_if_error, lease_ttl, max_lease_time, wait_timeout, on_wait_timeout, "
        "background, beta, fail_open, unfilled_ttl and max_value_size."
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


# --- settings accepted silently before -------------------------------------------------


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


# --- a value signed, or not, unlike its reader -----------------------------------------


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


# --- the testing helpers ---------------------------------------------------------------


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


# --- incr on a missing key -------------------------------------------------------------


def test_incr_of_a_missing_key_is_none_and_creates_nothing(make_driver: Any) -> None:
    sf = make_driver()
    assert sf.incr("counter", 5) is None
    assert sf.get("counter") is None  # unlike INCRBY, which would have stored 5
    assert "None" in stampede.Stampede.incr.__doc__  # type: ignore[operator]
