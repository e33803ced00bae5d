"""Django's own ``RedisCache`` (``get_or_set``) and django-redis's ``HerdClient``: peers of the
side-by-side run, added to one Django configuration per worker process; and Django set up once
with a set of caches, for the benchmarks that compare Django backends in one process."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from .._common.phase import Phase
from .base import SOCKET_TIMEOUT, STALE_TTL, PeerSpec, SyncPeer, SyncRebuild

__all__ = ["HERD", "PEER", "DjangoHerdPeer", "DjangoPeer", "add_cache", "configure"]


def configure(caches: Mapping[str, dict[str, Any]], *, secret_key: str) -> None:
    """Set Django up in this process with ``caches`` (once a process). ``StampedeCache`` signs with
    keys derived from ``secret_key`` (its default), as a Django project's would."""
    import django
    from django.conf import settings

    settings.configure(SECRET_KEY=secret_key, CACHES=dict(caches), USE_TZ=True)
    django.setup()


def add_cache(alias: str, config: dict[str, Any]) -> None:
    """Add the cache ``alias`` to this process's Django settings, configuring Django on first use.

    Several Django peers may run in one worker process, and Django is configured only once: the
    first adds a placeholder ``default`` (Django wants one), the others add their alias to
    ``CACHES``, which Django reads when a cache is first used (after every peer is opened).
    """
    import django
    from django.conf import settings

    if settings.configured:
        settings.CACHES[alias] = config
        return
    caches = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}, alias: config}
    settings.configure(CACHES=caches)
    django.setup()


def _close_caches() -> None:
    from django.core.cache import close_caches

    close_caches()


class DjangoPeer(SyncPeer):
    def __init__(self, url: str, prefix: str) -> None:
        add_cache(
            "default",
            {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": url,
                "KEY_PREFIX": f"{prefix}django",
                "OPTIONS": {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": 10.0},
            },
        )

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        from django.core.cache import caches

        # Looked up in the calling thread: Django keeps one backend instance per thread.
        return functools.partial(caches["default"].get_or_set, phase.key, rebuild, phase.ttl)

    def close(self) -> None:
        _close_caches()


PEER = PeerSpec(
    name="django",
    label="Django `RedisCache.get_or_set`",
    short="Django get_or_set",
    modules=("django", "redis"),
    distributions=("Django",),
    stale=False,
    config=(
        "`django.core.cache.backends.redis.RedisCache` with `LOCATION` the server's URL, `KEY_PREFIX` "
        "the run's prefix, `OPTIONS={'socket_timeout': 30}`, set with `settings.configure()` and "
        "`django.setup()` in each worker; a request is `caches['default'].get_or_set(key, rebuild, "
        "timeout=ttl)` (Django gives each thread its own backend instance, so its own pool). On a "
        "miss Django runs the rebuild, then `add` (`SET NX EX`) and `GET` again."
    ),
    open_sync=lambda at: DjangoPeer(at.url, at.prefix),
    why={
        "rebuilds": "`get_or_set` is a `get`, then the rebuild and an `add`: nothing stops concurrent "
        "misses from each rebuilding",
        "hit": "its `RedisCacheClient` makes a new `redis.Redis` object for every call",
    },
)


def _herd_get(cache: Any, key: str, ttl: int, rebuild: SyncRebuild) -> Any:
    value = cache.get(key)
    if value is not None:
        return value
    value = rebuild()
    cache.set(key, value, ttl)
    return value


class DjangoHerdPeer(SyncPeer):
    def __init__(self, url: str, prefix: str) -> None:
        add_cache(
            "herd",
            {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": url,
                "KEY_PREFIX": f"{prefix}herd",
                "OPTIONS": {
                    "CLIENT_CLASS": "django_redis.client.HerdClient",
                    "SOCKET_TIMEOUT": SOCKET_TIMEOUT,
                    "SOCKET_CONNECT_TIMEOUT": 10.0,
                },
            },
        )
        from django.conf import settings

        settings.CACHE_HERD_TIMEOUT = STALE_TTL  # read by each HerdClient when it is made

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        from django.core.cache import caches

        # Looked up in the calling thread: Django keeps one backend instance per thread.
        return functools.partial(_herd_get, caches["herd"], phase.key, phase.ttl, rebuild)

    def close(self) -> None:
        _close_caches()


HERD = PeerSpec(
    name="django-herd",
    label="django-redis `HerdClient`",
    short="django-redis herd",
    modules=("django", "django_redis", "redis"),
    distributions=("django-redis",),
    stale=True,
    config=(
        "`django_redis.cache.RedisCache` with `OPTIONS={'CLIENT_CLASS': "
        "'django_redis.client.HerdClient', 'SOCKET_TIMEOUT': 30}` and `CACHE_HERD_TIMEOUT = "
        f"{STALE_TTL}`: a value is stored for ttl + {STALE_TTL} s with its own expiry time beside "
        "it; past that, each `get` returns a miss with a probability that grows with the time "
        "since (whole seconds), and every caller that draws one rebuilds. A request is `get`, and on "
        "a miss rebuild and `set(key, value, ttl)`; `get_or_set` would store nothing on a refresh "
        "(its `add` is `SET NX`, and the old value is still there)."
    ),
    open_sync=lambda at: DjangoHerdPeer(at.url, at.prefix),
    why={
        "rebuilds": "nothing locks: every caller that misses rebuilds, and past a value's own expiry "
        "each `get` is a miss with a probability that grows with the seconds since"
    },
)
