"""``STAMPEDE_*`` settings: read once at ``init_app``, checked, named in every error."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import itsdangerous

import stampede

from ._errors import bad, close_match
from ._redis import redis_options

__all__ = [
    "SCOPES_IN_G",
    "StampedeConfig",
    "build_serializer",
    "event_hook",
    "near_cache",
    "setting_of",
    "signing_keys",
]

#: The attribute of ``flask.g`` that holds a request's lease scopes (the
#: Flask-Caching backend's, by backend); never copied into another thread's ``g``.
SCOPES_IN_G = "_flask_stampede_leases"

logger = logging.getLogger("flask_stampede")

_CORE = {
    "STAMPEDE_TTL": "ttl",
    "STAMPEDE_STALE_TTL": "stale_ttl",
    "STAMPEDE_STALE_IF_ERROR": "stale_if_error",
    "STAMPEDE_LEASE_TTL": "lease_ttl",
    "STAMPEDE_MAX_LEASE_TIME": "max_lease_time",
    "STAMPEDE_WAIT_TIMEOUT": "wait_timeout",
    "STAMPEDE_ON_WAIT_TIMEOUT": "on_wait_timeout",
    "STAMPEDE_BACKGROUND": "background",
    "STAMPEDE_BETA": "beta",
    "STAMPEDE_FAIL_OPEN": "fail_open",
    "STAMPEDE_UNFILLED_TTL": "unfilled_ttl",
    "STAMPEDE_MAX_VALUE_SIZE": "max_value_size",
}
_OWN = {
    "STAMPEDE_REDIS_URL",
    "STAMPEDE_REDIS_OPTIONS",
    "STAMPEDE_NAMESPACE",
    "STAMPEDE_SERIALIZER",
    "STAMPEDE_SIGNING_KEY",
    "STAMPEDE_CACHE_HEADER",
    "STAMPEDE_CACHE_CONTROL",
    "STAMPEDE_ON_EVENT",
    "STAMPEDE_NEAR_CACHE",
    "STAMPEDE_TAG_CHECK_INTERVAL",
    "STAMPEDE_COMPRESS_ABOVE",
}
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name
#: The setting of each of stampede's options and arguments, by its name in
#: the core (a ConfigurationError's ``field``): STAMPEDE_WAIT_TIMEOUT for wait_timeout.
_SETTING_OF = {name: key for key, name in _CORE.items()} | {
    key.removeprefix("STAMPEDE_").lower(): key for key in _OWN
}


def setting_of(exc: stampede.ConfigurationError, default: str) -> str:
    """The ``STAMPEDE_*`` setting of the argument ``exc`` is about (its
    ``field``; ``near_cache`` for ``near_cache.max_entries``), else ``default``."""
    return _SETTING_OF.get((exc.field or "").partition(".")[0], default)


def build_serializer(setting: Any, name: str = "STAMPEDE_SERIALIZER") -> stampede.Serializer:
    """The serializer a setting names, or an error naming the setting."""
    try:
        return stampede.serializer_from(setting)
    except stampede.ConfigurationError as exc:
        raise bad(name, f"is invalid: {exc}") from exc


def event_hook(setting: Any, name: str = "STAMPEDE_ON_EVENT") -> stampede.EventHook | None:
    """The ``on_event`` hook a setting names (a callable, its dotted path, or
    a list of them), or an error naming the setting."""
    try:
        return stampede.hook_from(setting, name)
    except stampede.ConfigurationError as exc:
        raise stampede.ConfigurationError(f"flask_stampede: {exc}") from exc


#: The keys of a dict near cache setting: stampede.NearCache's fields.
_NEAR_CACHE_KEYS = ("max_entries", "max_bytes", "max_value_bytes")


def near_cache(setting: Any, name: str = "STAMPEDE_NEAR_CACHE") -> stampede.NearCache | None:
    """The near cache a setting asks for: ``None``, ``False`` or ``0`` (off),
    ``True`` (the default bounds), a number of entries, a ``stampede.NearCache``,
    or a dict of ``max_entries``, ``max_bytes`` and ``max_value_bytes``; or an
    error naming the setting."""
    if isinstance(setting, dict):
        unknown = sorted((key for key in setting if key not in _NEAR_CACHE_KEYS), key=repr)
        if unknown:
            raise bad(name, f"has no key {unknown[0]!r}; its keys are {', '.join(_NEAR_CACHE_KEYS)}")
    try:
        if isinstance(setting, dict):
            return stampede.NearCache(**setting)
        return stampede.NearCache.from_setting(setting)
    except stampede.ConfigurationError as exc:
        # Name the dict's key at fault: NearCache's field ("near_cache.max_bytes").
        key = (exc.field or "").partition(".")[2]
        where = f"{name}[{key!r}]" if key in _NEAR_CACHE_KEYS and isinstance(setting, dict) else name
        raise bad(where, f"is invalid: {exc}") from exc


#: What the keys derived from the app's SECRET_KEY are salted with.
_SIGNING_SALT = "flask_stampede.values"


def signing_keys(
    app_config: Mapping[str, Any], given_in: Mapping[str, Any], key: str, name: str
) -> tuple[bytes, ...] | None:
    """The keys values are signed with, as ``given_in[key]`` (the setting
    ``name``) says, the same for the extension and the Flask-Caching backend:

    - absent: keys derived from the app's ``SECRET_KEY`` (then
      ``SECRET_KEY_FALLBACKS``) by itsdangerous's HMAC key derivation, as
      Flask's session cookies are; an app without a ``SECRET_KEY`` stores
      values unsigned, with a warning;
    - ``None`` or ``False``: values are stored unsigned, SECRET_KEY or not,
      without a warning, as with Django's ``OPTIONS["SIGNING_KEY"] = None``:
      for a Redis no one else can write to;
    - a key (``bytes`` or ``str``, 16 bytes or more), or a list of them (the
      first signs, any verifies): those.
    """
    if key in given_in:
        given = given_in[key]
        if given is None or given is False:
            return None
        try:
            signer = stampede.signer_from(given, name)
        except stampede.ConfigurationError as exc:  # it names the setting
            raise stampede.ConfigurationError(f"flask_stampede: {exc}") from None
        assert signer is not None
        return signer.keys
    secrets = [app_config.get("SECRET_KEY"), *(app_config.get("SECRET_KEY_FALLBACKS") or ())]
    if not secrets[0]:
        logger.warning(
            "flask_stampede: cached values are not signed, as the app has no SECRET_KEY: anyone who "
            "can write to the Redis can plant values this app deserializes (set SECRET_KEY or "
            "%s; set it to None or False to silence this on a Redis no one else can write to)",
            name,
        )
        return None
    return tuple(
        itsdangerous.Signer(
            secret, salt=_SIGNING_SALT, key_derivation="hmac", digest_method=hashlib.sha256
        ).derive_key()
        for secret in secrets
    )


@dataclass(frozen=True)
class StampedeConfig:
    """An app's ``STAMPEDE_*`` settings, checked."""

    redis_url: str
    redis_options: dict[str, Any] = field(hash=False)
    namespace: str
    options: stampede.Options
    serializer: stampede.Serializer
    cache_header: str | None
    cache_control: bool
    signing_keys: tuple[bytes, ...] | None = field(default=None, compare=False)  # never shown
    on_event: stampede.EventHook | None = None
    near_cache: stampede.NearCache | None = None
    tag_check_interval: float = 0.1
    compress_above: int | None = 1024

    def __repr__(self) -> str:
        # Printed by error reporters and debuggers: no password in it.
        hidden = ("password", "ssl_password", "credential_provider")
        options = {name: "***" if name in hidden else value for name, value in self.redis_options.items()}
        return (
            f"StampedeConfig(redis_url={stampede.redact_url(self.redis_url)!r}, redis_options={options!r}, "
            f"namespace={self.namespace!r}, options={self.options!r}, near_cache={self.near_cache!r})"
        )

    def core_kwargs(self, *, near: bool = True) -> dict[str, Any]:
        """The keyword arguments of the core's ``Stampede`` (sync and asyncio) for
        these settings; without the near cache if not ``near``."""
        return {
            "namespace": self.namespace,
            "options": self.options,
            "serializer": self.serializer,
            "signing_key": self.signing_keys,
            "on_event": self.on_event,
            "near_cache": self.near_cache if near else None,
            "tag_check_interval": self.tag_check_interval,
            "compress_above": self.compress_above,
        }

    @classmethod
    def from_config(cls, config: Any) -> StampedeConfig:
        unknown = sorted(
            key
            for key in config
            if isinstance(key, str) and key.startswith("STAMPEDE_") and key not in _CORE and key not in _OWN
        )
        if unknown:
            known = sorted(_CORE) + sorted(_OWN)
            raise bad(
                unknown[0],
                "is not a known setting."
                + close_match(unknown[0], known)
                + f" The known ones are {', '.join(known)}",
            )
        try:
            options = stampede.Options.from_mapping(
                {field: config[key] for key, field in _CORE.items() if key in config}
            )
        except stampede.ConfigurationError as exc:
            raise bad(setting_of(exc, "STAMPEDE_*"), f"is invalid: {exc}") from exc
        url = (
            config.get("STAMPEDE_REDIS_URL")
            or os.environ.get("STAMPEDE_REDIS_URL")
            or os.environ.get("REDIS_URL")
        )
        if not isinstance(url, str) or stampede.redis_url_kind(url) is None:
            raise bad(
                "STAMPEDE_REDIS_URL",
                "must be a redis://, rediss://, unix://, redis+cluster:// or redis+sentinel:// URL, "
                f"got {(stampede.redact_url(url) if isinstance(url, str) else url)!r}",
            )
        options_of_redis = redis_options(
            config.get("STAMPEDE_REDIS_OPTIONS", {}),
            "STAMPEDE_REDIS_OPTIONS",
            "STAMPEDE_REDIS_URL",
            _SETTING_OF,
        )
        header = config.get("STAMPEDE_CACHE_HEADER")
        if header is not None and (not isinstance(header, str) or not _TOKEN.fullmatch(header)):
            raise bad(
                "STAMPEDE_CACHE_HEADER", f"must be a header name such as 'X-Cache', or None, got {header!r}"
            )
        near = near_cache(config.get("STAMPEDE_NEAR_CACHE"))
        if near is not None and stampede.redis_url_kind(url) == "cluster":
            raise bad("STAMPEDE_NEAR_CACHE", "cannot be used with a Redis Cluster yet")
        cache_control = config.get("STAMPEDE_CACHE_CONTROL", False)
        if not isinstance(cache_control, bool):
            raise bad("STAMPEDE_CACHE_CONTROL", f"must be True or False, got {cache_control!r}")
        return cls(
            redis_url=url,
            redis_options={"socket_timeout": 5.0, "socket_connect_timeout": 5.0, **options_of_redis},
            namespace=config.get("STAMPEDE_NAMESPACE", "flask"),
            options=options,
            serializer=build_serializer(config.get("STAMPEDE_SERIALIZER", "pickle")),
            cache_header=header,
            cache_control=cache_control,
            signing_keys=signing_keys(config, config, "STAMPEDE_SIGNING_KEY", "STAMPEDE_SIGNING_KEY"),
            on_event=event_hook(config.get("STAMPEDE_ON_EVENT")),
            near_cache=near,
            tag_check_interval=config.get("STAMPEDE_TAG_CHECK_INTERVAL", 0.1),
            compress_above=config.get("STAMPEDE_COMPRESS_ABOVE", 1024),
        )
