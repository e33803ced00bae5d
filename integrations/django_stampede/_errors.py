"""How the backend reports a setting it cannot use: ``ImproperlyConfigured``
naming the setting as the user wrote it, with no password shown."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

import stampede

from ._option_names import STAMPEDE_OPTIONS

__all__ = ["bad", "improperly_configured", "shown"]

#: The OPTIONS key that sets each argument or option of the core, by the
#: core's name for it (a ConfigurationError's ``field``).
_KEY_OF_FIELD = {
    "namespace": "NAMESPACE",
    "serializer": "SERIALIZER",
    "near_cache": "NEAR_CACHE",
    "tag_check_interval": "TAG_CHECK_INTERVAL",
    "compress_above": "COMPRESS_ABOVE",
    **{field: key for key, field in STAMPEDE_OPTIONS.items()},
}


def bad(setting: str, problem: str) -> ImproperlyConfigured:
    """The error for ``setting`` (``"LOCATION"``, ``"OPTIONS['STALE_TTL']"``...)."""
    return ImproperlyConfigured(f"django_stampede: {setting} {problem}")


def shown(location: Any) -> str:
    """A LOCATION (a URL or several) fit for a message: passwords hidden."""
    if isinstance(location, (list, tuple)):
        return "[" + ", ".join(repr(stampede.redact_url(url)) for url in location) + "]"
    return repr(stampede.redact_url(location)) if isinstance(location, str) else repr(location)


def improperly_configured(exc: stampede.ConfigurationError) -> ImproperlyConfigured:
    """The Django error for a configuration stampede refused, naming the
    OPTIONS key that set the argument at fault (its ``field``), if one did."""
    key = _KEY_OF_FIELD.get((exc.field or "").partition(".")[0])
    return bad(f"OPTIONS[{key!r}]" if key else "OPTIONS", f"is invalid: {exc}")
