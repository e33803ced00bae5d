"""The keys a ``CACHES`` entry's ``OPTIONS`` may hold: stampede's, in capitals,
and redis-py's connection options, in lower case, as for Django's own
``RedisCache``; and what an unknown key was likely meant as."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

import redis
import redis.connection

__all__ = [
    "CLASS_OPTIONS",
    "DJANGO_REDIS",
    "NEAR_CACHE_KEYS",
    "NOT_POOL_OPTIONS",
    "OTHER_OPTIONS",
    "STAMPEDE_OPTIONS",
    "pool_options_with",
    "unknown_option",
]

#: stampede's options (those of stampede.Options), by OPTIONS key.
STAMPEDE_OPTIONS = {
    "STALE_TTL": "stale_ttl",
    "STALE_IF_ERROR": "stale_if_error",
    "LEASE_TTL": "lease_ttl",
    "MAX_LEASE_TIME": "max_lease_time",
    "WAIT_TIMEOUT": "wait_timeout",
    "ON_WAIT_TIMEOUT": "on_wait_timeout",
    "BACKGROUND": "background",
    "BETA": "beta",
    "FAIL_OPEN": "fail_open",
    "UNFILLED_TTL": "unfilled_ttl",
    "MAX_VALUE_SIZE": "max_value_size",
}
#: stampede's other settings, each read on its own.
OTHER_OPTIONS = {
    *("NAMESPACE", "SERIALIZER", "SIGNING_KEY", "ON_EVENT", "SENTINELS", "NEAR_CACHE"),
    *("TAG_CHECK_INTERVAL", "COMPRESS_ABOVE", "RECORD_CALLS"),
}
#: The keys of a dict ``NEAR_CACHE``, as stampede.NearCache's fields.
NEAR_CACHE_KEYS = {
    "MAX_ENTRIES": "max_entries",
    "MAX_BYTES": "max_bytes",
    "MAX_VALUE_BYTES": "max_value_bytes",
}
#: django-redis's options for what stampede configures another way.
DJANGO_REDIS = {"CLIENT_CLASS", "CONNECTION_POOL_CLASS", "CONNECTION_POOL_KWARGS", "SENTINEL_KWARGS"}
#: The lower-case OPTIONS that name a class (or its dotted path), as for Django's RedisCache.
CLASS_OPTIONS = ("pool_class", "parser_class", "connection_class")
#: redis-py keywords that LOCATION gives instead (or that stampede cannot use), and why.
NOT_POOL_OPTIONS = {
    "host": "is given by LOCATION ('redis://host:port/db')",
    "port": "is given by LOCATION ('redis://host:port/db')",
    "path": "is given by LOCATION ('unix:///path/to/redis.sock')",
    "unix_socket_path": "is given by LOCATION ('unix:///path/to/redis.sock')",
    "ssl": "is given by LOCATION: 'rediss://' for TLS",
    "url": "is given by LOCATION",
    "decode_responses": (
        "cannot be set: stampede stores binary envelopes and reads them as bytes "
        "(decode_responses=False, redis-py's default, is what it needs)"
    ),
}
#: Where redis-py's connection options are described.
_REDIS_PY_DOCS = "https://redis.readthedocs.io/en/stable/connections.html"


def _keywords(cls: Any) -> set[str]:
    """The keyword arguments ``cls`` takes by name."""
    try:
        parameters = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):  # a builtin's, or no signature
        return set()
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {parameter.name for parameter in parameters if parameter.kind in keyword} - {"self"}


def _pool_option_names() -> frozenset[str]:
    names: set[str] = {"max_connections", *CLASS_OPTIONS}
    for cls in (
        redis.connection.AbstractConnection,
        redis.connection.Connection,
        redis.connection.SSLConnection,
        redis.connection.UnixDomainSocketConnection,
    ):
        names.update(_keywords(cls))
    return frozenset(names - NOT_POOL_OPTIONS.keys())


_POOL_OPTIONS = _pool_option_names()


def pool_options_with(classes: dict[str, Any]) -> frozenset[str]:
    """The lower-case OPTIONS taken with these pool and connection classes:
    redis-py's, and the classes' own (``timeout`` of a ``BlockingConnectionPool``)."""
    names = set(_POOL_OPTIONS)
    for name in ("pool_class", "connection_class"):
        if isinstance(classes.get(name), type):
            names.update(_keywords(classes[name]))
    return frozenset(names - NOT_POOL_OPTIONS.keys())


def unknown_option(name: Any, pool_options: frozenset[str]) -> str:
    """What to say of an OPTIONS key neither stampede nor redis-py takes: what
    it may have been meant as, and where the known ones are described."""
    if not isinstance(name, str):
        return "is not a known option: OPTIONS keys are strings"
    upper, lower = name.upper(), name.lower()
    if upper in STAMPEDE_OPTIONS or upper in OTHER_OPTIONS:
        return (
            f"is stampede's {upper}, and stampede's options go in capitals: write OPTIONS[{upper!r}] "
            "(lower case is for redis-py's connection options)"
        )
    if lower in pool_options:
        return (
            f"is redis-py's {lower}, and redis-py's connection options go in lower case: "
            f"write OPTIONS[{lower!r}] (capitals are for stampede's options)"
        )
    if lower in NOT_POOL_OPTIONS:
        return NOT_POOL_OPTIONS[lower]
    if name in ("TTL", "ttl", "TIMEOUT"):  # not "timeout": a BlockingConnectionPool's option
        return (
            "is not an option: how long values stay fresh is the cache's TIMEOUT, beside LOCATION "
            "and OPTIONS (OPTIONS['STALE_TTL'] is how long they are served stale after that)"
        )
    known = {key.lower(): key for key in (*STAMPEDE_OPTIONS, *OTHER_OPTIONS, *pool_options)}
    close = difflib.get_close_matches(lower, known, n=1)
    hint = f" Did you mean OPTIONS[{known[close[0]]!r}]?" if close else ""
    return (
        "is not a known option: neither one of stampede's (in capitals) nor a redis-py connection "
        f"option (in lower case).{hint} stampede's are {', '.join(sorted(STAMPEDE_OPTIONS))}, "
        f"{', '.join(sorted(OTHER_OPTIONS))}, described in the docstring of "
        "django_stampede.StampedeCache; redis-py's are the keyword arguments of its connection "
        f"classes (db, socket_timeout, ssl_ca_certs, max_connections...), described at {_REDIS_PY_DOCS}"
    )
