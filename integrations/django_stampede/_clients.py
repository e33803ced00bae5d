"""The redis-py clients of a cache, blocking and asyncio, made from its
checked settings; connection options they will not take are named now,
not at the first command."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis
import redis._parsers
import redis.asyncio

import stampede
import stampede.asyncio

from ._errors import bad, shown
from ._option_names import CLASS_OPTIONS

if TYPE_CHECKING:
    from ._config import CacheConfig

__all__ = ["async_client", "sync_client"]


def sync_client(config: CacheConfig, url: str) -> Any:
    """The blocking client of ``url``, one of ``config.servers``."""
    options = dict(config.pool_options)
    if stampede.redis_url_kind(url) != "server":
        return _checked(stampede.redis_client(url, **_special_options(options)), url)
    pool_class = options.pop("pool_class", None) or redis.ConnectionPool
    return _checked(redis.Redis(connection_pool=pool_class.from_url(url, **options)), url)


def async_client(config: CacheConfig, url: str) -> Any:
    """The asyncio client of ``url``, one of ``config.servers``."""
    options = dict(config.pool_options)
    if stampede.redis_url_kind(url) != "server":
        return _checked(stampede.asyncio.redis_client(url, **_special_options(options)), url)
    # The classes are named for the sync methods: their asyncio twins serve
    # the async ones (a BlockingConnectionPool stays blocking-when-full).
    for name in CLASS_OPTIONS:
        if options.get(name) is not None:
            options[name] = _asyncio_twin(name, options[name])
    pool_class = options.pop("pool_class", None) or redis.asyncio.ConnectionPool
    return _checked(redis.asyncio.Redis(connection_pool=pool_class.from_url(url, **options)), url)


def _checked(client: Any, url: str) -> Any:
    """``client``, once its connections are known to take its options."""
    try:
        stampede.check_connection_options(client, url)
    except stampede.UnknownOptionError as exc:
        name = exc.field or ""
        # redis-py's connection class for a URL that is not TLS takes no ssl_* keyword.
        tls = "; ssl_* options configure TLS: use a rediss:// LOCATION" if name.startswith("ssl_") else ""
        raise bad(
            f"OPTIONS[{name!r}]",
            f"is not taken by {client.connection_pool.connection_class.__name__}, the connection class "
            f"for LOCATION {shown(url)}{tls}",
        ) from None
    except TypeError as exc:
        raise bad("OPTIONS", f"are invalid for LOCATION {shown(url)}: {exc}") from exc
    return client


def _special_options(options: dict[str, Any]) -> dict[str, Any]:
    """A cluster's or a Sentinel's clients make their own pools."""
    for name in CLASS_OPTIONS:
        if options.get(name) is not None:
            raise bad(f"OPTIONS[{name!r}]", "cannot be used with a cluster or Sentinel LOCATION")
    return {k: v for k, v in options.items() if k not in CLASS_OPTIONS}


def _is_asyncio(setting: str, cls: Any) -> bool:
    if not isinstance(cls, type):
        return False
    if setting == "parser_class":  # redis-py's asyncio parsers share no base apart from the blocking ones
        return any(klass.__name__.startswith("_Async") for klass in cls.__mro__)
    base = (
        redis.asyncio.ConnectionPool
        if setting == "pool_class"
        else redis.asyncio.connection.AbstractConnection
    )
    return issubclass(cls, base)


def _asyncio_twin(setting: str, cls: Any) -> Any:
    """The asyncio class that does for the async methods what ``cls`` does for
    the sync ones: ``cls`` itself if it is one, else redis-py's twin of it
    (``BlockingConnectionPool`` for ``BlockingConnectionPool``...)."""
    if _is_asyncio(setting, cls):
        return cls
    name = getattr(cls, "__name__", "")
    module = redis._parsers if setting == "parser_class" else redis.asyncio.connection
    for candidate in (name, f"_Async{name.lstrip('_')}"):
        twin = getattr(module, candidate, None)
        if twin is not cls and _is_asyncio(setting, twin):
            return twin
    raise bad(
        f"OPTIONS[{setting!r}]",
        f"names {cls!r}, a blocking class with no asyncio twin in redis-py: the async "
        "methods (aget, aset...) need one",
    )
