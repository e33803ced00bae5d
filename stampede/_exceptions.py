"""The exceptions stampede raises.

Every error the library itself raises derives from :class:`StampedeError`::

    StampedeError
    ├── ConfigurationError     bad argument, option, key or client, or a Redis that
    │   │                      refuses the client (a wrong password, an ACL, a cluster
    │   │                      node read as one server): also a ValueError
    │   ├── KeyTypeError       a key neither str nor bytes (also a TypeError)
    │   └── UnknownOptionError an unknown keyword argument or option (also a TypeError)
    ├── SerializationError     the serializer could not encode a value
    ├── RedisUnavailableError  Redis unreachable, timing out or refusing a command
    └── WaitTimeoutError       a missing key was not rebuilt within ``wait_timeout``
                               (also a TimeoutError)

A :class:`ConfigurationError` names the argument or option at fault in its
message, and as data in its ``field``. Exceptions raised by a rebuild
function are never wrapped: they reach the caller of ``get_or_rebuild``
unchanged.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "KeyTypeError",
    "RedisUnavailableError",
    "SerializationError",
    "StampedeError",
    "UnknownOptionError",
    "WaitTimeoutError",
]


class StampedeError(Exception):
    """Base class of every error raised by stampede itself."""


class ConfigurationError(StampedeError, ValueError):
    """An argument, option, key or client is not usable; the message names it.

    ``field`` names it as data, for code that reports the error in its own
    terms (a framework naming its setting): the argument or option at fault
    as stampede names it, such as an :class:`~stampede.Options` field
    (``"wait_timeout"``), a keyword of ``Stampede()`` (``"namespace"``,
    ``"compress_above"``, ``"near_cache"``, ``"serializer"``,
    ``"signing_key"``, ``"tag_check_interval"``...), a field of a nested
    setting after a dot (``"near_cache.max_entries"``), or a redis-py
    connection keyword (``"socket_timeout"``). ``None`` where no one
    argument is at fault (a Redis that refuses the client).
    """

    def __init__(self, *args: object, field: str | None = None) -> None:
        super().__init__(*args)
        #: The argument or option at fault, as stampede names it; ``None`` if none is.
        self.field = field


class KeyTypeError(ConfigurationError, TypeError):
    """A key that is neither ``str`` nor ``bytes``: a ``TypeError``, as Python
    code expects of a wrong type, and a :class:`ConfigurationError` too
    (``field``: ``"key"``)."""


class UnknownOptionError(ConfigurationError, TypeError):
    """A keyword argument or option that the call or class does not take: a
    ``TypeError``, as Python raises for an unexpected keyword, and a
    :class:`ConfigurationError` too. The message lists those it takes;
    ``field`` is the unknown name (the first in sorted order, of several)."""


class SerializationError(StampedeError):
    """The configured serializer could not encode a value."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class RedisUnavailableError(StampedeError):
    """Redis could not be reached, timed out, or refused a command.

    The driver's original exception is chained as ``__cause__``.
    """


class WaitTimeoutError(StampedeError, TimeoutError):
    """Another caller held the lease on a missing key for longer than ``wait_timeout``."""

    def __init__(self, key: str, wait_timeout: float) -> None:
        super().__init__(
            f"no value for key {key!r} after waiting {wait_timeout:g}s for the "
            "caller holding its lease (raise wait_timeout, or set "
            "on_wait_timeout='rebuild')"
        )
        self.key = key
        self.wait_timeout = wait_timeout
