"""Flask-Caching's ``@cache.memoize`` on its ``RedisCache``, called inside an app context as a
request would be."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from .._common.phase import Phase
from .base import SOCKET_TIMEOUT, PeerSpec, SyncPeer, SyncRebuild

__all__ = ["PEER", "FlaskCachingPeer"]


class FlaskCachingPeer(SyncPeer):
    def __init__(self, url: str, prefix: str, phases: Sequence[Phase]) -> None:
        import flask
        import flask_caching

        self.app = flask.Flask("stampede_bench")
        self.cache = flask_caching.Cache(
            self.app,
            config={
                "CACHE_TYPE": "RedisCache",
                "CACHE_REDIS_URL": url,
                "CACHE_KEY_PREFIX": f"{prefix}flask:",
                "CACHE_OPTIONS": {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": 10.0},
            },
        )
        # The memoized function computes whatever its calling thread asked for: memoize keys
        # a call by the function's name and arguments, so it must be one function per timeout
        # (with the same name in every process), not a closure per phase.
        self._current = threading.local()
        self.memoized: dict[int, Callable[[str], Any]] = {}
        for ttl in sorted({phase.ttl for phase in phases}):
            self.memoized[ttl] = self._memoize(ttl)

    def _memoize(self, ttl: int) -> Callable[[str], Any]:
        current = self._current

        def compute(key: str) -> Any:
            return current.rebuild()

        compute.__qualname__ = compute.__name__ = f"bench_value_ttl_{ttl}"
        return cast("Callable[[str], Any]", self.cache.memoize(timeout=ttl)(compute))

    @contextlib.contextmanager
    def session(self, phase: Phase, rebuild: SyncRebuild) -> Iterator[Callable[[], Any]]:
        self._current.rebuild = rebuild
        with self.app.app_context():  # as a request would have
            yield functools.partial(self.memoized[phase.ttl], phase.key)

    def close(self) -> None:
        with self.app.app_context():
            client = getattr(self.cache.cache, "_write_client", None)
            if client is not None:
                client.close()


PEER = PeerSpec(
    name="flask-caching",
    label="Flask-Caching `@cache.memoize`",
    short="Flask-Caching memoize",
    modules=("flask", "flask_caching", "redis"),
    distributions=("Flask-Caching",),
    stale=False,
    config=(
        "`flask_caching.Cache(app, config={'CACHE_TYPE': 'RedisCache', 'CACHE_REDIS_URL': url, "
        "'CACHE_KEY_PREFIX': prefix, 'CACHE_OPTIONS': {'socket_timeout': 30}})`; the rebuild is a "
        "function of the key decorated with `@cache.memoize(timeout=ttl)`, called inside an app "
        "context (one per thread). A memoized call reads the function's version key (`MGET`) and "
        "then the value (`GET`); a miss stores the value, then the version again with the same "
        "timeout."
    ),
    open_sync=lambda at: FlaskCachingPeer(at.url, at.prefix, at.phases),
    why={
        "rebuilds": "the function's version key expires with the value, and each caller that finds it "
        "gone writes a new random version, so the callers of one expiry look for different keys and "
        "some rebuild more than once; nothing coordinates the misses otherwise",
        "hit": "a memoized call reads the version key and then the value, and hashes its arguments",
    },
)
