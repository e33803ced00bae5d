"""What the outage sites (``outage_django``, ``outage_flask``) are told by the benchmark that starts
them (:mod:`bench.faults.outage`): one JSON object in the environment variable :data:`ENV`, read
once per server process; and each cache compared, set up its own way (Django's ``CACHES`` entry,
Flask's config) to give up on a Redis that does not answer within :attr:`AppConfig.socket_timeout`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .sustained_config import json_from_env

__all__ = ["CACHES", "ENV", "FLASK_CACHES", "AppConfig", "CacheName"]

#: The environment variable that carries an :class:`AppConfig` as JSON.
ENV = "BENCH_OUTAGE_APP"

#: The caches compared. On the Django site: Django's own ``RedisCache``, django-redis ignoring
#: Redis's exceptions, and ``StampedeCache`` failing open. On the Flask site: Flask-Caching's
#: ``@cache.cached`` on its own ``RedisCache`` (its decorators log a backend's errors and go on) and
#: on ``flask_stampede.StampedeCache`` failing open, and ``flask_stampede``'s ``@stampede.cached``
#: failing open.
CacheName = Literal[
    "django", "django-redis", "stampede", "flask-caching", "flask-caching-stampede", "flask-stampede"
]
CACHES: tuple[CacheName, ...] = (
    "django",
    "django-redis",
    "stampede",
    "flask-caching",
    "flask-caching-stampede",
    "flask-stampede",
)
#: The caches served by the Flask site (``outage_flask``); the others by the Django one.
FLASK_CACHES: frozenset[CacheName] = frozenset({"flask-caching", "flask-caching-stampede", "flask-stampede"})


@dataclass(frozen=True)
class AppConfig:
    """Which cache the site uses, its page's ``cache_page`` timeout and render, and where the
    renders are logged."""

    cache: CacheName
    redis_url: str
    #: ``cache_page``'s timeout: longer than a run, so that only the fault makes the page miss.
    page_timeout: int
    render_seconds: float
    #: Seconds to connect to Redis, and to wait for one answer of it, before giving up.
    socket_timeout: float
    #: The :class:`bench.load._timeline.Timeline` directory of the page's renders.
    timeline: str

    def to_env(self) -> dict[str, str]:
        return {ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls) -> AppConfig:
        return cls(**json_from_env(ENV, "bench.faults.outage"))

    def flask_config(self) -> dict[str, Any]:
        """The Flask app's config for a Flask cache, as each one's documentation sets its timeouts."""
        timeout = self.socket_timeout
        connection = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        if self.cache == "flask-stampede":
            return {
                "STAMPEDE_REDIS_URL": self.redis_url,
                "STAMPEDE_FAIL_OPEN": True,
                "STAMPEDE_REDIS_OPTIONS": connection,
            }
        if self.cache == "flask-caching-stampede":
            return {
                "CACHE_TYPE": "flask_stampede.StampedeCache",
                "CACHE_REDIS_URL": self.redis_url,
                "CACHE_DEFAULT_TIMEOUT": self.page_timeout,
                "CACHE_OPTIONS": {"fail_open": True, "redis_options": connection},
            }
        # Flask-Caching hands CACHE_OPTIONS to cachelib's RedisCache, which hands them to redis-py.
        return {
            "CACHE_TYPE": "RedisCache",
            "CACHE_REDIS_URL": self.redis_url,
            "CACHE_DEFAULT_TIMEOUT": self.page_timeout,
            "CACHE_OPTIONS": connection,
        }

    def caches(self) -> dict[str, Any]:
        """``CACHES["default"]``, as each backend's documentation sets its timeouts."""
        timeout = self.socket_timeout
        if self.cache == "stampede":
            return {
                "BACKEND": "django_stampede.StampedeCache",
                "LOCATION": self.redis_url,
                "TIMEOUT": self.page_timeout,
                # Lower case: redis-py's connection options, as for Django's RedisCache.
                "OPTIONS": {"FAIL_OPEN": True, "socket_timeout": timeout, "socket_connect_timeout": timeout},
            }
        if self.cache == "django-redis":
            return {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": self.redis_url,
                "TIMEOUT": self.page_timeout,
                "OPTIONS": {
                    "IGNORE_EXCEPTIONS": True,
                    "SOCKET_TIMEOUT": timeout,
                    "SOCKET_CONNECT_TIMEOUT": timeout,
                },
            }
        return {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": self.redis_url,
            "TIMEOUT": self.page_timeout,
            # Django hands its OPTIONS to redis-py's connection pool.
            "OPTIONS": {"socket_timeout": timeout, "socket_connect_timeout": timeout},
        }
