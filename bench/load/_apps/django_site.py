"""The Django site: settings made in code (:func:`configure`), on stampede's cache backend or on
Django's own ``RedisCache``; its views are in :mod:`bench.load._apps.django_views`."""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["LOGGING", "TTL", "Backend", "configure"]

#: Seconds a page stays cached: far longer than a run, so each run sees one cold key and no expiry.
TTL = 60

Backend = Literal["stampede", "stock"]

#: Django's logging for a benchmark's server: with DEBUG off, Django only mails a view's exception
#: to the admins; this sends it to stderr, where the benchmark reads which errors the server hit.
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django.request": {"handlers": ["stderr"], "level": "ERROR", "propagate": False},
        "stampede": {"handlers": ["stderr"], "level": "WARNING"},
    },
}


def _cache(backend: Backend, url: str, namespace: str) -> dict[str, Any]:
    if backend == "stampede":
        return {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": url,
            "TIMEOUT": TTL,
            "OPTIONS": {"NAMESPACE": namespace},
        }
    return {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": url,
        "TIMEOUT": TTL,
        "KEY_PREFIX": namespace,
    }


def configure(backend: Backend, url: str, namespace: str) -> None:
    """Settle Django's settings for this process and set Django up; call once, before the app."""
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench-many-waiters-not-secret",
        ALLOWED_HOSTS=["127.0.0.1", "localhost"],
        ROOT_URLCONF="bench.load._apps.django_views",
        INSTALLED_APPS=[],
        MIDDLEWARE=[],
        DATABASES={},
        USE_TZ=True,
        CACHES={"default": _cache(backend, url, namespace)},
        LOGGING=LOGGING,
    )
    django.setup()
