"""A Flask-Caching backend: ``CACHE_TYPE = "flask_stampede.StampedeCache"``.

Existing ``@cache.cached`` and ``@cache.memoize`` code gets stale serving and
single flight unchanged: Flask-Caching calls ``get`` and, on a miss, ``set``;
here one request's ``get`` misses and takes the lease while the others get
the stale value (or wait for the set), and that request's ``set`` commits.
Leases belong to the app context (the request): a :class:`stampede.LeaseScope`
renews them while it lasts and settles them when it is torn down.
Flask-Caching's timeouts: ``None`` is the default, ``0`` forever. The settings
it takes are listed in :class:`StampedeCache`'s docstring.
"""

from __future__ import annotations

import os
import pickle
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from flask import Flask, g, has_app_context
from flask_caching.backends.base import BaseCache

import stampede

from ._command import caching_command
from ._config import SCOPES_IN_G, build_serializer, event_hook, near_cache, signing_keys
from ._errors import bad, close_match
from ._redis import redis_client, redis_options

__all__ = ["StampedeCache"]

#: stampede's options that apply to a cache Flask-Caching drives by get and set.
_CORE_OPTIONS = {
    "stale_ttl",
    "stale_if_error",
    "lease_ttl",
    "max_lease_time",
    "wait_timeout",
    "on_wait_timeout",
    "beta",
    "fail_open",
    "unfilled_ttl",
    "max_value_size",
}
_OWN_OPTIONS = {
    *("namespace", "serializer", "signing_key", "redis_options", "on_event", "near_cache"),
    *("tag_check_interval", "compress_above"),
}
#: stampede's options that do not: why, and what to use instead.
_NOT_HERE = {
    "ttl": (
        "does not apply to the Flask-Caching backend: Flask-Caching gives the timeouts "
        "(CACHE_DEFAULT_TIMEOUT, and the timeout of cached, memoize and set)"
    ),
    "background": (
        "does not apply to the Flask-Caching backend: Flask-Caching computes a value in the "
        "request whose get() missed and then calls set(), so stampede has no function to run in "
        "the background (the other requests are served the stale value meanwhile all the same); "
        "flask_stampede.Stampede's cached and memoize take background=True"
    ),
}


@contextmanager
def _as_cachelib() -> Iterator[None]:
    # cachelib's contract: "Pickling errors ... raise a subclass of pickle.PickleError".
    try:
        yield
    except stampede.SerializationError as exc:
        if exc.__cause__ is None:
            raise
        raise exc.__cause__ from None


def _url(config: dict[str, Any]) -> tuple[str, int | None, str]:
    """The Redis URL Flask-Caching's settings name, as its ``RedisCache``,
    ``RedisSentinelCache`` and ``RedisClusterCache`` read them, the database
    ``CACHE_REDIS_DB`` names (``None``: the URL's own), which, as in Flask-Caching,
    a database in the URL's path overrides, and the setting the URL comes from.

    ``CACHE_REDIS_CLUSTER`` (``"host:port,host:port"``: the startup nodes, any
    of which that answers is asked for the others), else
    ``CACHE_REDIS_SENTINELS`` (``[(host, port), ...]``) with
    ``CACHE_REDIS_SENTINEL_MASTER``, else ``CACHE_REDIS_URL``, else
    ``CACHE_REDIS_HOST`` and ``CACHE_REDIS_PORT``, else ``STAMPEDE_REDIS_URL`` or
    ``REDIS_URL`` from the environment; ``CACHE_REDIS_PASSWORD`` with any of them.
    """
    password = config.get("CACHE_REDIS_PASSWORD")
    if password is not None and not isinstance(password, str):
        raise bad("CACHE_REDIS_PASSWORD", f"must be a str, got {type(password).__name__}")
    auth = f":{quote(password, safe='')}@" if password else ""
    db = config.get("CACHE_REDIS_DB")
    if db is not None and (isinstance(db, bool) or not isinstance(db, int) or db < 0):
        raise bad("CACHE_REDIS_DB", f"must be a database number, got {db!r}")
    cluster = config.get("CACHE_REDIS_CLUSTER")
    if cluster:
        if not isinstance(cluster, str):
            raise bad("CACHE_REDIS_CLUSTER", f'must be "host:port[,host:port...]", got {cluster!r}')
        if db:
            raise bad("CACHE_REDIS_DB", "a Redis Cluster has only database 0")
        nodes = ",".join(node.strip() for node in cluster.split(","))
        return f"redis+cluster://{auth}{nodes}", None, "CACHE_REDIS_CLUSTER"
    sentinels = config.get("CACHE_REDIS_SENTINELS")
    if sentinels:
        try:
            hosts = ",".join(f"{host}:{int(port)}" for host, port in sentinels)
        except (TypeError, ValueError):
            raise bad("CACHE_REDIS_SENTINELS", f"must be a list of (host, port), got {sentinels!r}") from None
        service = config.get("CACHE_REDIS_SENTINEL_MASTER") or "mymaster"
        if not isinstance(service, str):
            raise bad("CACHE_REDIS_SENTINEL_MASTER", f"must be the name of a service, got {service!r}")
        return f"redis+sentinel://{auth}{hosts}/{service}/{db or 0}", None, "CACHE_REDIS_SENTINELS"
    url = config.get("CACHE_REDIS_URL")
    if url is None and config.get("CACHE_REDIS_HOST"):
        host, port = config["CACHE_REDIS_HOST"], config.get("CACHE_REDIS_PORT", 6379)
        if not isinstance(host, str) or isinstance(port, bool) or not isinstance(port, int):
            raise bad(
                "CACHE_REDIS_HOST", f"and CACHE_REDIS_PORT must be a str and an int, got {host!r}, {port!r}"
            )
        return f"redis://{auth}{host}:{port}/{db or 0}", None, "CACHE_REDIS_HOST"
    setting = "CACHE_REDIS_URL"
    if url is None:
        setting = next(
            (
                f"the {name} environment variable"
                for name in ("STAMPEDE_REDIS_URL", "REDIS_URL")
                if os.environ.get(name)
            ),
            setting,
        )
        url = os.environ.get("STAMPEDE_REDIS_URL") or os.environ.get("REDIS_URL")
    if not isinstance(url, str) or stampede.redis_url_kind(url) is None:
        shown = stampede.redact_url(url) if isinstance(url, str) else url
        raise bad(setting, f"must be a Redis URL, got {shown!r}")
    return url, db, setting


class _Cachelib:
    """A cachelib serializer (what Flask-Caching's ``CACHE_SERIALIZER`` names)
    as a stampede serializer: it writes the payload, stampede the envelope."""

    def __init__(self, chosen: Any) -> None:
        self.chosen = chosen
        kind = type(chosen)
        # One codec per serializer class, 64..127: values written by another
        # serializer are misses, not misreadings.
        self.codec_id = 64 + zlib.crc32(f"{kind.__module__}.{kind.__qualname__}".encode()) % 64

    def dumps(self, value: Any) -> bytes:
        data = self.chosen.dumps(value)
        if not isinstance(data, (bytes, bytearray)):
            # cachelib's serializers log and return None where they fail.
            raise pickle.PicklingError(
                f"{type(self.chosen).__name__} could not serialize a {type(value).__name__}"
            )
        return bytes(data)

    def loads(self, data: bytes | memoryview) -> Any:
        return self.chosen.loads(bytes(data))

    def __repr__(self) -> str:
        return f"{type(self.chosen).__name__}()"


class StampedeCache(BaseCache):
    """Flask-Caching's cache API on stampede.

    Settings: Flask-Caching's Redis ones (``CACHE_REDIS_URL``, or its
    ``CACHE_REDIS_CLUSTER``, ``CACHE_REDIS_SENTINELS``, ``CACHE_REDIS_HOST``...),
    ``CACHE_DEFAULT_TIMEOUT``, ``CACHE_KEY_PREFIX``, ``CACHE_SERIALIZER``, and
    ``CACHE_OPTIONS``, which takes exactly:

    - stampede's options that apply to a cache Flask-Caching drives by
      ``get`` and ``set``, in lower case: ``stale_ttl``, ``stale_if_error``, ``lease_ttl``,
      ``max_lease_time``, ``wait_timeout``, ``on_wait_timeout``, ``beta``,
      ``fail_open``, ``unfilled_ttl``, ``max_value_size``;
    - ``namespace`` (default ``"flask-caching"``), ``serializer`` (default
      ``"pickle"``; ``CACHE_SERIALIZER``, a cachelib serializer, wins),
      ``signing_key`` (as the extension's ``STAMPEDE_SIGNING_KEY``: absent,
      keys derived from the app's ``SECRET_KEY``; ``None`` or ``False``,
      unsigned), ``redis_options`` (redis-py's connection keyword arguments,
      as ``STAMPEDE_REDIS_OPTIONS``), ``on_event`` (a callable, its dotted
      path, or a list of them), ``near_cache`` (as ``STAMPEDE_NEAR_CACHE``),
      ``tag_check_interval`` and ``compress_above``.

    ``ttl`` and ``background`` are refused, saying why: Flask-Caching gives
    the timeouts, and computes values itself between ``get`` and ``set``, so
    there is nothing to refresh in the background. Any other key is refused
    with the known one closest to it.
    """

    def __init__(
        self,
        core: stampede.Stampede,
        default_timeout: int = 300,
        ignore_delete_many_errors: bool = False,
        key_prefix: str = "",
    ) -> None:
        super().__init__(default_timeout=default_timeout, ignore_delete_many_errors=ignore_delete_many_errors)
        self.stampede = core
        self.key_prefix = key_prefix
        self._outside = threading.local()  # leases taken outside any app context, per thread
        self._chosen: Any = None
        # Builds the core again with another serializer (set by factory()).
        self._remade: Callable[[stampede.Serializer], stampede.Stampede] | None = None

    @property
    def serializer(self) -> Any:
        """The cachelib serializer ``CACHE_SERIALIZER`` named, or ``None``
        (``CACHE_OPTIONS["serializer"]``, stampede's own, is used)."""
        return self._chosen

    @serializer.setter
    def serializer(self, chosen: Any) -> None:
        # Flask-Caching assigns CACHE_SERIALIZER here once the factory has run.
        if self._remade is None:
            raise stampede.ConfigurationError(
                "flask_stampede: this StampedeCache was not made by Flask-Caching; pass the "
                "serializer to the stampede.Stampede it wraps"
            )
        previous, self.stampede = self.stampede, self._remade(_Cachelib(chosen))
        previous.close()  # unused from now on: its near cache, if any, is no longer tracked
        self._chosen = chosen

    @classmethod
    def factory(
        cls, app: Flask, config: dict[str, Any], args: list[Any], kwargs: dict[str, Any]
    ) -> StampedeCache:
        """Built by Flask-Caching from its settings (see the class docstring)."""
        options = dict(kwargs)
        default_timeout = options.pop("default_timeout", 300)
        ignore_errors = options.pop("ignore_delete_many_errors", False)
        known = sorted(_CORE_OPTIONS | _OWN_OPTIONS)
        for name in sorted(options, key=repr):
            where = f"CACHE_OPTIONS[{name!r}]"
            if name in _NOT_HERE:
                raise bad(where, _NOT_HERE[name])
            if name not in _CORE_OPTIONS and name not in _OWN_OPTIONS:
                raise bad(
                    where,
                    "is not a known option."
                    + (close_match(name, known) if isinstance(name, str) else "")
                    + f" The known ones are {', '.join(known)}",
                )
        url, db, url_setting = _url(config)
        redis_setting = "CACHE_OPTIONS['redis_options']"
        checked = redis_options(
            options.pop("redis_options", {}),
            redis_setting,
            url_setting,
            {name: f"CACHE_OPTIONS[{name!r}]" for name in known if name != "redis_options"},
        )
        pool_options = {
            "socket_timeout": 5.0,
            "socket_connect_timeout": 5.0,
            **({} if db is None else {"db": db}),
            **checked,
        }
        serializer = build_serializer(options.pop("serializer", "pickle"), "CACHE_OPTIONS['serializer']")
        keys = signing_keys(app.config, options, "signing_key", "CACHE_OPTIONS['signing_key']")
        options.pop("signing_key", None)
        on_event = event_hook(options.pop("on_event", None), "CACHE_OPTIONS['on_event']")
        near = near_cache(options.pop("near_cache", None), "CACHE_OPTIONS['near_cache']")
        if near is not None and stampede.redis_url_kind(url) == "cluster":
            raise bad("CACHE_OPTIONS['near_cache']", "cannot be used with a Redis Cluster yet")
        client = redis_client(url, pool_options, redis_setting, url_setting)
        namespace = options.pop("namespace", "flask-caching")

        def made(serializer: stampede.Serializer) -> stampede.Stampede:
            return stampede.Stampede(
                client,
                namespace=namespace,
                serializer=serializer,
                signing_key=keys,
                on_event=on_event,
                near_cache=near,
                **options,
            )

        try:
            core = made(serializer)
        except stampede.ConfigurationError as exc:
            # The argument at fault (its field), by its CACHE_OPTIONS key: the
            # client's own refusals (decode_responses...) are redis_options'.
            field = (exc.field or "").partition(".")[0]
            key = "redis_options" if field == "client" else field
            known_here = (*options, "namespace", "serializer", "near_cache", "redis_options")
            named = f"[{key!r}]" if key in known_here else ""
            raise stampede.ConfigurationError(
                f"flask_stampede: CACHE_OPTIONS{named} is invalid: {exc}"
            ) from exc
        cache = cls(core, default_timeout, ignore_errors, config.get("CACHE_KEY_PREFIX") or "")
        cache._remade = made
        app.teardown_appcontext(cache._settle)
        if "stampede" not in app.cli.commands:  # the extension's, if it is there, comes first
            app.cli.add_command(caching_command)  # flask stampede ...
        return cache

    # --- the leases of the current request --------------------------------------

    def _scope(self) -> stampede.LeaseScope:
        """The lease scope of the running unit of work: the app context's (a
        request's, settled when it is torn down), else the thread's own
        (outside any app context, whose end nothing tells: not renewed)."""
        if not has_app_context():
            scope: stampede.LeaseScope | None = getattr(self._outside, "scope", None)
            if scope is None:
                scope = self._outside.scope = stampede.LeaseScope(renew=False)
            return scope
        scopes: dict[int, stampede.LeaseScope] | None = g.get(SCOPES_IN_G)
        if scopes is None:
            scopes = {}
            setattr(g, SCOPES_IN_G, scopes)
        scope = scopes.get(id(self))
        if scope is None:
            scope = scopes[id(self)] = stampede.LeaseScope()
        return scope

    def _settle(self, exc: BaseException | None = None) -> None:
        # The request ends: give back the leases of misses it never set (its
        # view chose not to cache, or raised), so that others go on at once.
        scopes: dict[int, stampede.LeaseScope] | None = g.get(SCOPES_IN_G)
        scope = scopes.pop(id(self), None) if scopes else None
        if scope is not None:
            scope.failed = exc is not None
            self.stampede.settle(scope)

    def _forget(self, name: str) -> None:
        """A write of ``name`` cancels this request's lease on it in Redis."""
        self._scope().take(self.stampede, name)

    def _ttl(self, timeout: Any) -> float | None | bool:
        """Flask-Caching's timeout as stampede's ttl; ``False``: expire at once."""
        seconds = self._normalize_timeout(timeout)
        if seconds == 0:
            return None  # forever
        return False if seconds < 0 else seconds

    # --- the API --------------------------------------------------------------------

    def get(self, key: str) -> Any:
        return self.stampede.read(self.key_prefix + key, scope=self._scope()).value

    def set(self, key: str, value: Any, timeout: Any = None, *, tags: Sequence[str] = ()) -> bool:
        """Store ``value``; ``tags`` (``cache.set(key, value, tags=[...])``): the
        groups it belongs to (see :meth:`invalidate_tags`)."""
        name = self.key_prefix + key
        ttl = self._ttl(timeout)
        lease = self._scope().take(self.stampede, name)
        with _as_cachelib():
            if ttl is False:
                self.stampede.delete(name)
            elif lease is not None:
                self.stampede.commit(lease, value, ttl=ttl, store_if_lapsed=True, tags=tags or None)
            else:
                self.stampede.set(name, value, ttl=ttl, tags=tags)
        return True

    def invalidate_tags(self, *tags: str) -> None:
        """Mark every entry carrying any of ``tags`` stale in every process
        (``cache.cache.invalidate_tags(...)``: Flask-Caching has no such call)."""
        self.stampede.invalidate_tags(*tags)

    def delete_tags(self, *tags: str) -> None:
        """Make every entry carrying any of ``tags`` read as missing."""
        self.stampede.delete_tags(*tags)

    def add(self, key: str, value: Any, timeout: Any = None) -> bool:
        name = self.key_prefix + key
        ttl = self._ttl(timeout)
        lease = self._scope().take(self.stampede, name)
        with _as_cachelib():
            added = False if ttl is False else self.stampede.add(name, value, ttl=ttl)
        if lease is not None:
            self.stampede.release(lease)
        return added

    def delete(self, key: str) -> bool:
        name = self.key_prefix + key
        self._forget(name)
        return self.stampede.delete(name)

    def get_many(self, *keys: str) -> list[Any]:
        found = self.stampede.get_many([self.key_prefix + key for key in keys])
        return [found.get(self.key_prefix + key) for key in keys]

    def set_many(self, mapping: dict[str, Any], timeout: Any = None) -> list[Any]:
        ttl = self._ttl(timeout)
        named = {self.key_prefix + key: value for key, value in mapping.items()}
        for name in named:
            self._forget(name)
        with _as_cachelib():
            if ttl is False:
                self.stampede.delete_many(named)
            else:
                self.stampede.set_many(named, ttl=ttl)
        return list(mapping)

    def delete_many(self, *keys: str) -> list[Any]:
        names = [self.key_prefix + key for key in keys]
        for name in names:
            self._forget(name)
        self.stampede.delete_many(names)
        return list(keys)  # absent afterwards: deleted, in cachelib's terms

    def has(self, key: str) -> bool:
        name = self.key_prefix + key
        # While this request holds the lease, its get() missed: so must has(),
        # or Flask-Caching (cache_none=True) takes the miss for a stored None.
        return not self._scope().holds(self.stampede, name) and self.stampede.has_key(name)

    def clear(self) -> bool:
        """Clear this cache: its ``CACHE_KEY_PREFIX`` only, if it has one."""
        scope = self._scope()
        for lease in scope.leases():
            if scope.take(self.stampede, lease.key) is not None:
                self.stampede.release(lease)  # stops its renewal; the clear deletes it anyway
        if self.key_prefix:
            self.stampede.delete_prefix(self.key_prefix)
        else:
            self.stampede.clear()
        return True

    def inc(self, key: str, delta: int = 1) -> int | None:
        name = self.key_prefix + key
        while True:  # cachelib: a missing key starts at delta
            value = self.stampede.incr(name, delta)
            if value is not None:
                return value
            if self.stampede.add(name, delta, ttl=self._ttl(None) or None):
                return delta

    def dec(self, key: str, delta: int = 1) -> int | None:
        return self.inc(key, -delta)
