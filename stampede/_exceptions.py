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
    ├── RebuildFailedError     a missing key's rebuild raised, elsewhere, moments ago:
    │                          nobody tries again until its back-off ends
    └── WaitTimeoutError       a missing key was not rebuilt within ``wait_timeout``
                               (also a TimeoutError)

A :class:`ConfigurationError` names the argument or option at fault in its
message, and as data in its ``field``. Exceptions raised by a rebuild
function are never wrapped: they reach the caller of ``get_or_rebuild``
unchanged (and its process's callers waiting on it); callers elsewhere get
a :class:`RebuildFailedError` with its text.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "KeyTypeError",
    "RebuildFailedError",
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

    The driver's original exception is chained as ``__cause__``. ``code``
    says which: the server's error code when it answered (``"OOM"``: out of
    memory, ``"LOADING"``, ``"READONLY"``, ``"BUSY"``, ``"MISCONF"``,
    ``"MAXCLIENTS"``, ``"MASTERDOWN"``, ``"CLUSTERDOWN"``, ``"TRYAGAIN"``...),
    ``"TOO_LARGE"`` for a value over the server's ``proto-max-bulk-len``,
    ``"TIMEOUT"`` or ``"CONNECTION"`` when it did not answer, ``"POOL"`` when
    this process's connection pool had no connection left, ``None`` when
    unknown. ``skipped``: the command was not sent, Redis having been found
    unreachable moments before (its circuit breaker is open).
    """

    def __init__(self, *args: object, code: str | None = None, skipped: bool = False) -> None:
        super().__init__(*args)
        self.code = code
        self.skipped = skipped


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


class RebuildFailedError(StampedeError):
    """The rebuild of a missing key raised in another caller (another process,
    or this one's earlier call) moments ago, and nobody tries again until
    its back-off ends: the caller gets the error at once, without a rebuild
    and without waiting.

    ``key``: the key; ``error``: that rebuild's exception as text
    (``"OperationalError: could not connect to server"``; the exception
    itself stayed in its process); ``failures``: how many rebuilds of the
    key raised in a row; ``retry_in``: seconds until the next may run.
    """

    def __init__(self, key: str, error: str, *, failures: int, retry_in: float) -> None:
        super().__init__(
            f"the rebuild of key {key!r} raised {error}; {failures} in a row, " f"the next in {retry_in:.2f}s"
        )
        self.key = key
        self.error = error
        self.failures = failures
        self.retry_in = retry_in
