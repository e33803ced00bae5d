"""The ``@cached`` decorator, sync and asyncio."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

import stampede
import stampede.asyncio
from stampede import ConfigurationError


def test_results_are_cached_per_arguments(sf: stampede.Stampede) -> None:
    calls: list[tuple[int, int]] = []

    @sf.cached(ttl=60)
    def add(a: int, b: int = 10) -> int:
        calls.append((a, b))
        return a + b

    assert add(1) == 11
    assert add(1, 10) == 11
    assert add(a=1, b=10) == 11  # the same call, however it is spelled
    assert add(2) == 12
    assert calls == [(1, 10), (2, 10)]
    assert add.__name__ == "add"
    assert add.key(1) == add.key(a=1, b=10)
    assert add.key(1).startswith("tests.test_cached.test_results_are_cached_per_arguments.<locals>.add(")


def test_invalidate_and_delete_one_call(sf: stampede.Stampede) -> None:
    calls: list[int] = []

    @sf.cached(ttl=60, stale_ttl=60)
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    square(3)
    square(4)
    assert square.invalidate(3) is True
    assert square(3) == 9  # refreshed inline by this caller
    square.delete(4)
    square(4)
    assert calls == [3, 4, 3, 4]


def test_fixed_and_computed_keys(sf: stampede.Stampede) -> None:
    @sf.cached(ttl=60, key="the-config")
    def config() -> dict[str, int]:
        return {"a": 1}

    @sf.cached(ttl=60, key=lambda user: f"user:{user.id}")
    def profile(user: object) -> str:
        return "p"

    class User:
        id = 7

    assert config() == {"a": 1}
    assert sf.get("the-config").value == {"a": 1}
    assert profile(User()) == "p"
    assert sf.get("user:7").value == "p"


def test_arguments_without_a_stable_repr_are_refused(sf: stampede.Stampede) -> None:
    @sf.cached(ttl=60)
    def describe(thing: object) -> str:
        return "x"

    with pytest.raises(ConfigurationError, match="argument 'thing'.*no stable repr.*key="):
        describe(object())


def test_long_arguments_are_hashed(sf: stampede.Stampede) -> None:
    @sf.cached(ttl=60)
    def echo(text: str) -> str:
        return text

    assert echo("x" * 1000) == "x" * 1000
    assert "sha256:" in echo.key("x" * 1000)
    assert echo.key("x" * 1000) != echo.key("y" * 1000)


def test_bad_options_fail_at_decoration(sf: stampede.Stampede) -> None:
    with pytest.raises(ConfigurationError, match="ttl"):
        sf.cached(ttl=-1)


async def test_async_cached(redis_url: str, namespace: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    sf = stampede.asyncio.Stampede(client, namespace=namespace)
    calls: list[int] = []

    @sf.cached(ttl=60)
    async def slow_double(x: int) -> int:
        calls.append(x)
        await asyncio.sleep(0.1)
        return 2 * x

    assert await asyncio.gather(*[slow_double(4) for _ in range(20)]) == [8] * 20
    assert calls == [4]
    assert await slow_double.invalidate(4) is True
    await slow_double.delete(4)
    assert await slow_double(4) == 8
    assert calls == [4, 4]
    await client.aclose()


def test_module_level_default(redis_url: str, monkeypatch: pytest.MonkeyPatch, namespace: str) -> None:
    stampede.configure(None)
    monkeypatch.delenv("STAMPEDE_REDIS_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(ConfigurationError, match="STAMPEDE_REDIS_URL"):
        stampede.get_or_rebuild("k", lambda: 1)
    monkeypatch.setenv("REDIS_URL", redis_url)
    try:
        key = f"{namespace}:default"
        assert stampede.get_or_rebuild(key, lambda: "built", ttl=60) == "built"
        assert stampede.get_or_rebuild(key, lambda: "again", ttl=60) == "built"
        assert stampede.default().namespace == "stampede"
        own = stampede.Stampede.from_url(redis_url, namespace=namespace)
        stampede.configure(own)
        assert stampede.default() is own
    finally:
        stampede.configure(None)
