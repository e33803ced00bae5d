"""redis-py's connection options (``STAMPEDE_REDIS_OPTIONS``,
``CACHE_OPTIONS["redis_options"]``), checked, and the clients made with
them; every error names the setting at fault as written."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import redis
import redis.cluster
import redis.connection

import stampede
import stampede.asyncio

from ._errors import bad, close_match

__all__ = ["redis_client", "redis_options"]

#: Where redis-py's connection options are described.
_REDIS_PY_DOCS = "https://redis.readthedocs.io/en/stable/connections.html"
#: redis-py keywords that the URL gives instead (or that stampede cannot use), and why.
_NOT_REDIS_OPTIONS = {
    "host": "is given by {url}",
    "port": "is given by {url}",
    "path": "is given by {url} (unix:///path/to/redis.sock)",
    "unix_socket_path": "is given by {url} (unix:///path/to/redis.sock)",
    "ssl": "is given by {url}: rediss:// for TLS",
    "url": "is given by {url}",
    "connection_pool": "cannot be given: the pool is made from {url}",
    "startup_nodes": "is given by {url} (redis+cluster://host:port,host:port)",
}


def _redis_option_names() -> frozenset[str]:
    """The keyword arguments that redis-py's clients, pools and connections
    take by name: those ``stampede.redis_client`` may be given."""
    names: set[str] = set()
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    for cls in (
        redis.Redis,
        redis.cluster.RedisCluster,
        redis.ConnectionPool,
        redis.connection.AbstractConnection,
        redis.connection.Connection,
        redis.connection.SSLConnection,
        redis.connection.UnixDomainSocketConnection,
    ):
        parameters = inspect.signature(cls.__init__).parameters.values()
        names.update(parameter.name for parameter in parameters if parameter.kind in keyword)
    names.update(redis.cluster.REDIS_ALLOWED_KEYS)
    return frozenset(names - {"self"} - _NOT_REDIS_OPTIONS.keys())


_REDIS_OPTIONS = _redis_option_names()


def redis_options(value: Any, setting: str, url_setting: str, elsewhere: Mapping[str, str]) -> dict[str, Any]:
    """``value``, the redis-py options of the dict ``setting``, checked: each
    key one that redis-py takes, or an error naming ``setting[key]``, the
    known option closest to it, and what the dict is for. ``elsewhere``: the
    settings that take stampede's options, by option (``stale_ttl``...)."""
    if not isinstance(value, dict):
        raise bad(setting, f"must be a dict of redis-py connection keyword arguments, got {value!r}")
    for name in value:
        where = f"{setting}[{name!r}]"
        if not isinstance(name, str):
            raise bad(where, "is not a known option: its keys are keyword argument names")
        if name in _REDIS_OPTIONS:
            continue
        if name in _NOT_REDIS_OPTIONS:
            raise bad(where, _NOT_REDIS_OPTIONS[name].format(url=url_setting))
        if name in elsewhere:
            raise bad(where, f"is one of stampede's options, not redis-py's: set {elsewhere[name]}")
        raise bad(
            where,
            "is not a known option."
            + close_match(name, sorted(_REDIS_OPTIONS))
            + f" {setting} holds redis-py's connection keyword arguments (socket_timeout, "
            f"ssl_ca_certs, max_connections, retry...: see {_REDIS_PY_DOCS})",
        )
    return value


def redis_client(
    url: str, options: dict[str, Any], setting: str, url_setting: str, *, asynchronous: bool = False
) -> Any:
    """The redis-py client (blocking, or ``asynchronous``) for ``url`` with
    ``options`` (checked by :func:`redis_options`), or an error naming the
    setting at fault: ``url_setting`` (the URL) or ``setting[key]`` (an
    option the client or the URL's connections do not take). Connects lazily."""
    make = stampede.asyncio.redis_client if asynchronous else stampede.redis_client
    shown = f"{url_setting} {stampede.redact_url(url)!r}"
    try:
        client = make(url, **options)
    except stampede.UnknownOptionError as exc:  # the client class's: another URL will not help
        raise bad(f"{setting}[{exc.field!r}]", f"is not taken by the redis-py client for {shown}") from None
    except stampede.ConfigurationError as exc:
        raise bad(url_setting, f"is invalid: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise bad(setting, f"is invalid: {exc}") from exc
    try:
        stampede.check_connection_options(client, url)
    except stampede.UnknownOptionError as exc:
        name = exc.field or ""
        connection_class = client.connection_pool.connection_class.__name__
        # redis-py's connection class for a URL that is not TLS takes no ssl_* keyword.
        tls = "; ssl_* options configure TLS: use a rediss:// URL" if name.startswith("ssl_") else ""
        raise bad(
            f"{setting}[{name!r}]",
            f"is not taken by {connection_class}, the connection class for {shown}{tls}",
        ) from None
    except TypeError as exc:
        raise bad(setting, f"is invalid: {exc}") from exc
    return client
