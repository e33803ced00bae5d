"""Translate a ``CACHES`` entry into stampede's configuration, or say what is wrong."""

from __future__ import annotations

import difflib
import inspect
import re
from dataclasses import dataclass, field
from typing import Any

import redis
import redis._parsers
import redis.asyncio
import redis.connection
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.crypto import salted_hmac
from django.utils.module_loading import import_string

import stampede
import stampede.asyncio

__all__ = ["CacheConfig", "improperly_configured", "options_of"]

# OPTIONS in capitals are stampede's; in lower case, as for Django's own
# RedisCache, they go to redis-py's connection pool.
_STAMPEDE_OPTIONS = {
    "STALE_TTL": "stale_ttl",
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
_OTHER_OPTIONS = {
    *("NAMESPACE", "SERIALIZER", "SIGNING_KEY", "ON_EVENT", "SENTINELS", "NEAR_CACHE"),
    *("TAG_CHECK_INTERVAL", "COMPRESS_ABOVE"),
}
#: The keys of a dict ``NEAR_CACHE``, as stampede.NearCache's fields.
_NEAR_CACHE_KEYS = {
    "MAX_ENTRIES": "max_entries",
    "MAX_BYTES": "max_bytes",
    "MAX_VALUE_BYTES": "max_value_bytes",
}
#: django-redis's options for what stampede configures another way.
_DJANGO_REDIS = {"CLIENT_CLASS", "CONNECTION_POOL_CLASS", "CONNECTION_POOL_KWARGS", "SENTINEL_KWARGS"}
_DEFAULT_POOL = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0, "health_check_interval": 30}
#: The lower-case OPTIONS that name a class (or its dotted path), as for Django's RedisCache.
_CLASS_OPTIONS = ("pool_class", "parser_class", "connection_class")
#: redis-py keywords that LOCATION gives instead (or that stampede cannot use), and why.
_NOT_POOL_OPTIONS = {
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
#: The settings a CacheConfig holds as given (the core checks them), and what they must be.
_COMPARED_AS_GIVEN = {
    "NAMESPACE": "a str",
    "TAG_CHECK_INTERVAL": "a number of seconds",
    "COMPRESS_ABOVE": "a number of bytes, or None",
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
    names: set[str] = {"max_connections", *_CLASS_OPTIONS}
    for cls in (
        redis.connection.AbstractConnection,
        redis.connection.Connection,
        redis.connection.SSLConnection,
        redis.connection.UnixDomainSocketConnection,
    ):
        names.update(_keywords(cls))
    return frozenset(names - _NOT_POOL_OPTIONS.keys())


_POOL_OPTIONS = _pool_option_names()


def _pool_options_with(classes: dict[str, Any]) -> frozenset[str]:
    """The lower-case OPTIONS taken with these pool and connection classes:
    redis-py's, and the classes' own (``timeout`` of a ``BlockingConnectionPool``)."""
    names = set(_POOL_OPTIONS)
    for name in ("pool_class", "connection_class"):
        if isinstance(classes.get(name), type):
            names.update(_keywords(classes[name]))
    return frozenset(names - _NOT_POOL_OPTIONS.keys())


def _unknown_option(name: Any, pool_options: frozenset[str]) -> ImproperlyConfigured:
    """The error for an OPTIONS key neither stampede nor redis-py takes: what
    it may have been meant as, and where the known ones are described."""
    where = f"OPTIONS[{name!r}]"
    if not isinstance(name, str):
        return _bad(where, "is not a known option: OPTIONS keys are strings")
    upper, lower = name.upper(), name.lower()
    if upper in _STAMPEDE_OPTIONS or upper in _OTHER_OPTIONS:
        return _bad(
            where,
            f"is stampede's {upper}, and stampede's options go in capitals: write OPTIONS[{upper!r}] "
            "(lower case is for redis-py's connection options)",
        )
    if lower in pool_options:
        return _bad(
            where,
            f"is redis-py's {lower}, and redis-py's connection options go in lower case: "
            f"write OPTIONS[{lower!r}] (capitals are for stampede's options)",
        )
    if lower in _NOT_POOL_OPTIONS:
        return _bad(where, _NOT_POOL_OPTIONS[lower])
    if name in ("TTL", "ttl", "TIMEOUT"):  # not "timeout": a BlockingConnectionPool's option
        return _bad(
            where,
            "is not an option: how long values stay fresh is the cache's TIMEOUT, beside LOCATION "
            "and OPTIONS (OPTIONS['STALE_TTL'] is how long they are served stale after that)",
        )
    known = {key.lower(): key for key in (*_STAMPEDE_OPTIONS, *_OTHER_OPTIONS, *pool_options)}
    close = difflib.get_close_matches(lower, known, n=1)
    hint = f" Did you mean OPTIONS[{known[close[0]]!r}]?" if close else ""
    return _bad(
        where,
        "is not a known option: neither one of stampede's (in capitals) nor a redis-py connection "
        f"option (in lower case).{hint} stampede's are {', '.join(sorted(_STAMPEDE_OPTIONS))}, "
        f"{', '.join(sorted(_OTHER_OPTIONS))}, described in the docstring of "
        "django_stampede.StampedeCache; redis-py's are the keyword arguments of its connection "
        f"classes (db, socket_timeout, ssl_ca_certs, max_connections...), described at {_REDIS_PY_DOCS}",
    )


#: Pool options never shown.
_SECRETS = frozenset({"password", "ssl_password", "credential_provider"})


def _shown(location: Any) -> str:
    """A LOCATION (a URL or several) fit for a message: passwords hidden."""
    if isinstance(location, (list, tuple)):
        return "[" + ", ".join(repr(stampede.redact_url(url)) for url in location) + "]"
    return repr(stampede.redact_url(location)) if isinstance(location, str) else repr(location)


def _bad(setting: str, problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"django_stampede: {setting} {problem}")


def improperly_configured(exc: stampede.ConfigurationError) -> ImproperlyConfigured:
    """The Django error for a configuration stampede refused, naming the setting."""
    text = str(exc)
    names = {
        "namespace": "NAMESPACE",
        "near_cache": "NEAR_CACHE",
        "tag_check_interval": "TAG_CHECK_INTERVAL",
        "compress_above": "COMPRESS_ABOVE",
        **{field: key for key, field in _STAMPEDE_OPTIONS.items()},
    }
    setting = next((key for field, key in names.items() if text.startswith(field + " ")), None)
    return _bad(f"OPTIONS[{setting!r}]" if setting else "OPTIONS", f"is invalid: {text}")


#: The schemes of a Redis Cluster (any node) and of a Sentinel-watched service
#: (see stampede.Stampede.from_url): one LOCATION each, never split on commas.
_SPECIAL = re.compile(r"^rediss?\+(cluster|sentinel)://")


def _servers(location: Any) -> tuple[str, ...]:
    if isinstance(location, str) and _SPECIAL.match(location.strip()):
        servers = [location.strip()]
    elif isinstance(location, str):
        servers = [part.strip() for part in re.split("[;,]", location) if part.strip()]
    elif isinstance(location, (list, tuple)) and all(isinstance(part, str) for part in location):
        servers = list(location)
    else:
        raise _bad("LOCATION", f"must be a Redis URL or a list of them, got {_shown(location)}")
    if not servers:
        raise _bad("LOCATION", "names no Redis server")
    for url in servers:
        if _SPECIAL.match(url) and len(servers) > 1:
            raise _bad("LOCATION", f"a cluster or Sentinel URL stands alone, got {_shown(location)}")
        if not re.match(r"^(rediss?(\+cluster|\+sentinel)?|unix)://", url):
            raise _bad(
                "LOCATION",
                f"entry {_shown(url)} is not a redis://, rediss://, unix://, "
                "redis+cluster:// or redis+sentinel:// URL",
            )
    return tuple(servers)


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
    raise _bad(
        f"OPTIONS[{setting!r}]",
        f"names {cls!r}, a blocking class with no asyncio twin in redis-py: the async "
        "methods (aget, aset...) need one",
    )


def _sentinel_location(servers: tuple[str, ...], sentinels: Any) -> str:
    """django-redis's Sentinel convention (LOCATION ``redis://<service>/<db>``,
    OPTIONS ``SENTINELS``) as the ``redis+sentinel://`` URL it means."""
    try:
        addresses = [f"{host}:{int(port)}" for host, port in sentinels]
        if not addresses or not all(isinstance(host, str) and host for host, _ in sentinels):
            raise ValueError
    except (TypeError, ValueError):
        raise _bad("OPTIONS['SENTINELS']", f"must be a list of (host, port), got {sentinels!r}") from None
    if len(servers) != 1 or not re.match(r"^rediss?://", servers[0]):
        raise _bad(
            "LOCATION",
            f"with OPTIONS['SENTINELS'] must be one 'redis://<service>/<db>' URL, got {_shown(servers)}",
        )
    scheme, rest = servers[0].split("://", 1)
    authority, _, path = rest.partition("/")
    credentials, at, service = authority.rpartition("@")
    if not service or ":" in service:
        raise _bad(
            "LOCATION", f"with OPTIONS['SENTINELS'] names the service as its host, got {_shown(servers[0])}"
        )
    db = path.split("?", 1)[0].strip("/") or "0"
    return f"{scheme}+sentinel://{credentials}{at}{','.join(addresses)}/{service}/{db}"


def _settled(setting: Any) -> Any:
    _serializer(setting)  # fail now, at configuration, not at first use
    return setting


def _serializer(setting: Any) -> stampede.Serializer:
    try:
        return stampede.serializer_from(setting)
    except stampede.ConfigurationError as exc:
        raise _bad("OPTIONS['SERIALIZER']", f"is invalid: {exc}") from exc


def _near_cache(setting: Any, servers: tuple[str, ...]) -> stampede.NearCache | None:
    """``OPTIONS["NEAR_CACHE"]`` as stampede takes it: ``None``, ``False`` or
    ``0`` (off), ``True`` (the default bounds), a number of entries, a
    ``stampede.NearCache``, or a dict of ``MAX_ENTRIES``, ``MAX_BYTES`` and
    ``MAX_VALUE_BYTES`` (the others keep their defaults)."""
    name = "OPTIONS['NEAR_CACHE']"
    if isinstance(setting, dict):
        unknown = sorted((key for key in setting if key not in _NEAR_CACHE_KEYS), key=repr)
        if unknown:
            raise _bad(name, f"has no key {unknown[0]!r}; its keys are {', '.join(_NEAR_CACHE_KEYS)}")
    try:
        near = (
            stampede.NearCache(**{_NEAR_CACHE_KEYS[key]: value for key, value in setting.items()})
            if isinstance(setting, dict)
            else stampede.NearCache.from_setting(setting)
        )
    except stampede.ConfigurationError as exc:
        # Name the dict's key at fault, if any (NearCache names its field).
        named = [key for key, attr in _NEAR_CACHE_KEYS.items() if f"near_cache {attr} " in str(exc)]
        where = f"{name}[{named[0]!r}]" if named and isinstance(setting, dict) else name
        raise _bad(where, f"is invalid: {exc}") from exc
    if near is not None and (len(servers) > 1 or re.match(r"^rediss?\+cluster://", servers[0])):
        # Refused by stampede too (tracking is per node, replicas lag), but
        # said here in Django's terms, before a cluster client is made.
        raise _bad(
            name,
            "cannot be used yet with a Redis Cluster LOCATION, nor with replicas (a LOCATION of several "
            "servers)",
        )
    return near


#: What Django's key derivation is salted with for this use of SECRET_KEY.
_SIGNING_SALT = "django_stampede.cache.values"


def _signing_keys(raw: dict[str, Any]) -> tuple[bytes, ...] | None:
    """The keys values are signed with: ``OPTIONS["SIGNING_KEY"]`` as given
    (``None`` or ``False``: unsigned), else derived from ``SECRET_KEY`` and
    ``SECRET_KEY_FALLBACKS`` by Django's ``salted_hmac``, as Django derives
    the keys of its own signatures, so rotating ``SECRET_KEY`` rotates them."""
    if "SIGNING_KEY" in raw:
        given = raw["SIGNING_KEY"]
        if given is None or given is False:
            return None
        try:
            signer = stampede.signer_from(given, "OPTIONS['SIGNING_KEY']")
        except stampede.ConfigurationError as exc:  # it names the setting
            raise ImproperlyConfigured(f"django_stampede: {exc}") from None
        assert signer is not None
        return signer.keys
    try:
        secret = settings.SECRET_KEY
    except ImproperlyConfigured:  # Django's "must not be empty": answered below, in our terms
        if not settings.configured:
            raise
        secret = ""
    if not secret:
        raise ImproperlyConfigured(
            "django_stampede: StampedeCache signs the values it stores with a key derived from "
            "SECRET_KEY, and SECRET_KEY is empty: set SECRET_KEY, or give the cache "
            "OPTIONS['SIGNING_KEY']: a key of 16 bytes or more (or a list of them, the first "
            "signing), or None to store values unsigned, for a Redis no one else can write to"
        )
    secrets = [secret, *getattr(settings, "SECRET_KEY_FALLBACKS", ())]
    return tuple(
        salted_hmac(_SIGNING_SALT, "signing key", secret=secret, algorithm="sha256").digest()
        for secret in secrets
    )


def _class_option(setting: str, value: Any) -> Any:
    """``OPTIONS[setting]`` (``pool_class``...) as a class: given, or imported
    from its dotted path; ``None``: redis-py's default."""
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise _bad(f"OPTIONS[{setting!r}]", f"cannot import {value!r}: {exc}") from exc
    if value is not None and not isinstance(value, type):
        raise _bad(f"OPTIONS[{setting!r}]", f"must be a class or its dotted path, got {value!r}")
    return value


def _unexpected_keyword(exc: TypeError) -> str | None:
    """The keyword a ``TypeError`` says a function did not expect, if it says so."""
    found = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    return found.group(1) if found else None


def _check_connection(client: Any, url: str) -> None:
    """Build (not connect) a connection of ``client``'s pool: redis-py keeps the
    options a pool is given and tries them only at the first command, where
    one its connection class does not take would be a bare ``TypeError``."""
    pool = getattr(client, "connection_pool", None)  # a cluster client has one per node
    if pool is None:
        return
    try:
        pool.connection_class(**pool.connection_kwargs)
    except TypeError as exc:
        name = _unexpected_keyword(exc)
        if name is None:
            raise _bad("OPTIONS", f"are invalid for LOCATION {_shown(url)}: {exc}") from exc
        tls = name.startswith("ssl_") and not url.startswith(("rediss://", "rediss+"))
        raise _bad(
            f"OPTIONS[{name!r}]",
            f"is not taken by {pool.connection_class.__name__}, the connection class for LOCATION "
            f"{_shown(url)}" + ("; ssl_* options configure TLS: use a rediss:// LOCATION" if tls else ""),
        ) from None


def options_of(params: dict[str, Any]) -> dict[str, Any]:
    """The ``OPTIONS`` of a ``CACHES`` entry, checked to be a dict."""
    raw = params.get("OPTIONS", {}) or {}
    if not isinstance(raw, dict):
        raise _bad("OPTIONS", f"must be a dict, got {raw!r}")
    return raw


def _hashable(value: Any) -> Any:
    """``value`` in a form that can be compared and hashed (lists of retry
    errors, dicts of keepalive options...), for telling equal settings apart."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((str(key), _hashable(item)) for key, item in value.items()))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


@dataclass(frozen=True)
class CacheConfig:
    """One cache's settings, checked; equal settings share connections."""

    servers: tuple[str, ...]
    pool_options: tuple[tuple[str, Any], ...] = field(compare=False)  # as given, for redis-py
    options: stampede.Options
    namespace: str
    serializer: Any  # the setting (a name, path or object): compared, not built, per instance
    on_event: stampede.EventHook | None
    signing_keys: tuple[bytes, ...] | None = None  # never shown
    near_cache: stampede.NearCache | None = None
    tag_check_interval: float = 0.1
    compress_above: int | None = 1024
    pool_key: Any = None  # pool_options, hashable: what comparisons use

    def __repr__(self) -> str:
        # Printed by error reporters and debuggers: no password in it.
        pool = {name: "***" if name in _SECRETS else value for name, value in self.pool_options}
        return (
            f"CacheConfig(servers={_shown(self.servers)}, pool_options={pool!r}, "
            f"options={self.options!r}, namespace={self.namespace!r}, near_cache={self.near_cache!r})"
        )

    @classmethod
    def from_django(cls, location: Any, params: dict[str, Any]) -> CacheConfig:
        raw = options_of(params)
        core: dict[str, Any] = {}
        pool: dict[str, Any] = dict(_DEFAULT_POOL)
        # The classes first: they take options of their own.
        pool.update((name, _class_option(name, raw[name])) for name in _CLASS_OPTIONS if name in raw)
        pool_options = _pool_options_with(pool)
        for name, value in raw.items():
            if name in _STAMPEDE_OPTIONS:
                core[_STAMPEDE_OPTIONS[name]] = value
            elif name in _OTHER_OPTIONS or name in _CLASS_OPTIONS:
                continue
            elif name == "serializer":
                raise _bad(
                    "OPTIONS['serializer']",
                    "is not supported: stampede stores envelopes; set "
                    "OPTIONS['SERIALIZER'] to 'pickle', 'json' or a stampede serializer",
                )
            elif name in pool_options:
                pool[name] = value
            elif name in _DJANGO_REDIS:
                raise _bad(
                    f"OPTIONS[{name!r}]",
                    "is django-redis's; with stampede, a Sentinel service is LOCATION "
                    "'redis://<service>/<db>' with OPTIONS['SENTINELS'] = [(host, port), ...] "
                    "(or LOCATION 'redis+sentinel://host:26379/<service>/<db>'), a cluster "
                    "LOCATION 'redis+cluster://host:port', and pool options go in lower case",
                )
            else:
                raise _unknown_option(name, pool_options)
        try:
            options = stampede.Options.from_mapping(core)
        except stampede.ConfigurationError as exc:
            raise improperly_configured(exc) from exc
        for name, expected in _COMPARED_AS_GIVEN.items():
            try:
                hash(raw.get(name))
            except TypeError:  # would be a bare "unhashable type" from the registry of cores
                raise _bad(
                    f"OPTIONS[{name!r}]", f"is invalid: it must be {expected}, got {raw[name]!r}"
                ) from None
        namespace = raw.get("NAMESPACE", "django")
        try:
            # A callable, its dotted path, or a list of them, called in turn;
            # equal settings give equal hooks, so backends still share cores.
            on_event = stampede.hook_from(raw.get("ON_EVENT"), "OPTIONS['ON_EVENT']")
        except stampede.ConfigurationError as exc:
            raise ImproperlyConfigured(f"django_stampede: {exc}") from exc
        servers = _servers(location)
        if raw.get("SENTINELS") is not None:
            servers = (_sentinel_location(servers, raw["SENTINELS"]),)
        return cls(
            servers=servers,
            pool_options=tuple(sorted(pool.items())),
            pool_key=_hashable(pool),
            options=options,
            namespace=namespace,
            serializer=_settled(raw.get("SERIALIZER", "pickle")),
            on_event=on_event,
            signing_keys=_signing_keys(raw),
            near_cache=_near_cache(raw.get("NEAR_CACHE"), servers),
            tag_check_interval=raw.get("TAG_CHECK_INTERVAL", 0.1),
            compress_above=raw.get("COMPRESS_ABOVE", 1024),
        )

    def sync_client(self, url: str) -> Any:
        options = dict(self.pool_options)
        if _SPECIAL.match(url):
            client = stampede.redis_client(url, **self._special_options(options))
            _check_connection(client, url)
            return client
        pool_class = options.pop("pool_class", None) or redis.ConnectionPool
        client = redis.Redis(connection_pool=pool_class.from_url(url, **options))
        _check_connection(client, url)
        return client

    def async_client(self, url: str) -> Any:
        options = dict(self.pool_options)
        if _SPECIAL.match(url):
            client = stampede.asyncio.redis_client(url, **self._special_options(options))
            _check_connection(client, url)
            return client
        # The classes are named for the sync methods: their asyncio twins serve
        # the async ones (a BlockingConnectionPool stays blocking-when-full).
        for name in _CLASS_OPTIONS:
            if options.get(name) is not None:
                options[name] = _asyncio_twin(name, options[name])
        pool_class = options.pop("pool_class", None) or redis.asyncio.ConnectionPool
        client = redis.asyncio.Redis(connection_pool=pool_class.from_url(url, **options))
        _check_connection(client, url)
        return client

    @staticmethod
    def _special_options(options: dict[str, Any]) -> dict[str, Any]:
        """A cluster's or a Sentinel's clients make their own pools."""
        for name in _CLASS_OPTIONS:
            if options.get(name) is not None:
                raise _bad(f"OPTIONS[{name!r}]", "cannot be used with a cluster or Sentinel LOCATION")
        return {k: v for k, v in options.items() if k not in _CLASS_OPTIONS}

    def core_kwargs(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "options": self.options,
            "serializer": _serializer(self.serializer),
            "signing_key": self.signing_keys,
            "on_event": self.on_event,
            "near_cache": self.near_cache,
            "tag_check_interval": self.tag_check_interval,
            "compress_above": self.compress_above,
        }
