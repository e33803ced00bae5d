"""Read a ``CACHES`` entry into the settings of a cache, checked, or say
which setting is wrong and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

import stampede

from ._errors import bad, improperly_configured, shown
from ._location import sentinel_location, servers_of
from ._option_names import (
    CLASS_OPTIONS,
    DJANGO_REDIS,
    NEAR_CACHE_KEYS,
    OTHER_OPTIONS,
    STAMPEDE_OPTIONS,
    pool_options_with,
    unknown_option,
)
from ._recording_hook import on_event as recording_hook
from ._signing import signing_keys

__all__ = ["CacheConfig", "options_of"]

_DEFAULT_POOL = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0, "health_check_interval": 30}
#: The settings a CacheConfig holds as given (the core checks them), and what they must be.
_COMPARED_AS_GIVEN = {
    "NAMESPACE": "a str",
    "TAG_CHECK_INTERVAL": "a number of seconds",
    "COMPRESS_ABOVE": "a number of bytes, or None",
}
#: Pool options never shown.
_SECRETS = frozenset({"password", "ssl_password", "credential_provider"})
#: The OPTIONS['NEAR_CACHE'] key of each field of stampede.NearCache.
_NEAR_CACHE_KEY_OF = {attr: key for key, attr in NEAR_CACHE_KEYS.items()}


def options_of(params: dict[str, Any]) -> dict[str, Any]:
    """The ``OPTIONS`` of a ``CACHES`` entry, checked to be a dict."""
    raw = params.get("OPTIONS", {}) or {}
    if not isinstance(raw, dict):
        raise bad("OPTIONS", f"must be a dict, got {raw!r}")
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
    record_calls: bool = False  # for the debug toolbar panel and the cache header (see _recording)
    pool_key: Any = None  # pool_options, hashable: what comparisons use

    def __repr__(self) -> str:
        # Printed by error reporters and debuggers: no password in it.
        pool = {name: "***" if name in _SECRETS else value for name, value in self.pool_options}
        return (
            f"CacheConfig(servers={shown(self.servers)}, pool_options={pool!r}, "
            f"options={self.options!r}, namespace={self.namespace!r}, near_cache={self.near_cache!r})"
        )

    @classmethod
    def from_django(cls, location: Any, params: dict[str, Any]) -> CacheConfig:
        raw = options_of(params)
        core: dict[str, Any] = {}
        pool: dict[str, Any] = dict(_DEFAULT_POOL)
        # The classes first: they take options of their own.
        pool.update((name, _class_option(name, raw[name])) for name in CLASS_OPTIONS if name in raw)
        pool_options = pool_options_with(pool)
        for name, value in raw.items():
            if name in STAMPEDE_OPTIONS:
                core[STAMPEDE_OPTIONS[name]] = value
            elif name in OTHER_OPTIONS or name in CLASS_OPTIONS:
                continue
            elif name == "serializer":
                raise bad(
                    "OPTIONS['serializer']",
                    "is not supported: stampede stores envelopes; set "
                    "OPTIONS['SERIALIZER'] to 'pickle', 'json' or a stampede serializer",
                )
            elif name in pool_options:
                pool[name] = value
            elif name in DJANGO_REDIS:
                raise bad(
                    f"OPTIONS[{name!r}]",
                    "is django-redis's; with stampede, a Sentinel service is LOCATION "
                    "'redis://<service>/<db>' with OPTIONS['SENTINELS'] = [(host, port), ...] "
                    "(or LOCATION 'redis+sentinel://host:26379/<service>/<db>'), a cluster "
                    "LOCATION 'redis+cluster://host:port', and pool options go in lower case",
                )
            else:
                raise bad(f"OPTIONS[{name!r}]", unknown_option(name, pool_options))
        try:
            options = stampede.Options.from_mapping(core)
        except stampede.ConfigurationError as exc:
            raise improperly_configured(exc) from exc
        for name, expected in _COMPARED_AS_GIVEN.items():
            try:
                hash(raw.get(name))
            except TypeError:  # would be a bare "unhashable type" from the registry of cores
                raise bad(
                    f"OPTIONS[{name!r}]", f"is invalid: it must be {expected}, got {raw[name]!r}"
                ) from None
        namespace = raw.get("NAMESPACE", "django")
        try:
            # A callable, its dotted path, or a list of them, called in turn;
            # equal settings give equal hooks, so backends still share cores.
            on_event = stampede.hook_from(raw.get("ON_EVENT"), "OPTIONS['ON_EVENT']")
        except stampede.ConfigurationError as exc:
            raise ImproperlyConfigured(f"django_stampede: {exc}") from exc
        record_calls = raw.get("RECORD_CALLS", False)
        if not isinstance(record_calls, bool):
            raise bad("OPTIONS['RECORD_CALLS']", f"must be True or False, got {record_calls!r}")
        if record_calls:
            # Last, after the user's hooks: it only files the event away.
            on_event = stampede.hook_from([on_event, recording_hook] if on_event else recording_hook)
        servers = servers_of(location)
        if raw.get("SENTINELS") is not None:
            servers = (sentinel_location(servers, raw["SENTINELS"]),)
        return cls(
            servers=servers,
            pool_options=tuple(sorted(pool.items())),
            pool_key=_hashable(pool),
            options=options,
            namespace=namespace,
            serializer=_settled(raw.get("SERIALIZER", "pickle")),
            on_event=on_event,
            signing_keys=signing_keys(raw),
            near_cache=_near_cache(raw.get("NEAR_CACHE"), servers),
            tag_check_interval=raw.get("TAG_CHECK_INTERVAL", 0.1),
            compress_above=raw.get("COMPRESS_ABOVE", 1024),
            record_calls=record_calls,
        )

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


def _settled(setting: Any) -> Any:
    _serializer(setting)  # fail now, at configuration, not at first use
    return setting


def _serializer(setting: Any) -> stampede.Serializer:
    try:
        return stampede.serializer_from(setting)
    except stampede.ConfigurationError as exc:
        raise bad("OPTIONS['SERIALIZER']", f"is invalid: {exc}") from exc


def _near_cache(setting: Any, servers: tuple[str, ...]) -> stampede.NearCache | None:
    """``OPTIONS["NEAR_CACHE"]`` as stampede takes it: ``None``, ``False`` or
    ``0`` (off), ``True`` (the default bounds), a number of entries, a
    ``stampede.NearCache``, or a dict of ``MAX_ENTRIES``, ``MAX_BYTES`` and
    ``MAX_VALUE_BYTES`` (the others keep their defaults)."""
    name = "OPTIONS['NEAR_CACHE']"
    if isinstance(setting, dict):
        unknown = sorted((key for key in setting if key not in NEAR_CACHE_KEYS), key=repr)
        if unknown:
            raise bad(name, f"has no key {unknown[0]!r}; its keys are {', '.join(NEAR_CACHE_KEYS)}")
    try:
        near = (
            stampede.NearCache(**{NEAR_CACHE_KEYS[key]: value for key, value in setting.items()})
            if isinstance(setting, dict)
            else stampede.NearCache.from_setting(setting)
        )
    except stampede.ConfigurationError as exc:
        # Name the dict's key at fault, if any: NearCache's field ("near_cache.max_bytes").
        key = _NEAR_CACHE_KEY_OF.get((exc.field or "").partition(".")[2])
        where = f"{name}[{key!r}]" if key and isinstance(setting, dict) else name
        raise bad(where, f"is invalid: {exc}") from exc
    if near is not None and (len(servers) > 1 or stampede.redis_url_kind(servers[0]) == "cluster"):
        # Refused by stampede too (tracking is per node, replicas lag), but
        # said here in Django's terms, before a cluster client is made.
        raise bad(
            name,
            "cannot be used yet with a Redis Cluster LOCATION, nor with replicas (a LOCATION of several "
            "servers)",
        )
    return near


def _class_option(setting: str, value: Any) -> Any:
    """``OPTIONS[setting]`` (``pool_class``...) as a class: given, or imported
    from its dotted path; ``None``: redis-py's default."""
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise bad(f"OPTIONS[{setting!r}]", f"cannot import {value!r}: {exc}") from exc
    if value is not None and not isinstance(value, type):
        raise bad(f"OPTIONS[{setting!r}]", f"must be a class or its dotted path, got {value!r}")
    return value
