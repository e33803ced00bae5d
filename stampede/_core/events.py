"""Observability: the events stampede reports to a user-supplied callback."""

from __future__ import annotations

import enum
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._exceptions import ConfigurationError

__all__ = [
    "Event",
    "EventHook",
    "EventKind",
    "hook_from",
    "logger",
]

logger = logging.getLogger("stampede")


class EventKind(str, enum.Enum):
    """What happened to a key."""

    HIT = "hit"  #: a fresh value was served
    STALE_HIT = "stale_hit"  #: a stale value was served while another caller refreshes
    MISS = "miss"  #: no usable value in Redis
    LEASE_WON = "lease_won"  #: this caller holds the rebuild lease
    LEASE_BUSY = "lease_busy"  #: another caller holds the rebuild lease
    LEASE_LOST = "lease_lost"  #: the lease expired or was taken while rebuilding
    WAIT = "wait"  #: waiting for another caller's rebuild (``duration`` = time waited)
    WAIT_TIMEOUT = "wait_timeout"  #: gave up waiting after ``wait_timeout``
    REBUILD = "rebuild"  #: a rebuild finished (``duration`` = its run time)
    REBUILD_ERROR = "rebuild_error"  #: a rebuild raised (``error``)
    COMMIT_REJECTED = "commit_rejected"  #: a rebuilt value was not written: lease lost
    COMMIT_FAILED = "commit_failed"  #: a rebuilt value could not be written: Redis failed (``error``)
    CORRUPT = "corrupt"  #: data under the key was not readable; treated as a miss
    REDIS_ERROR = "redis_error"  #: a Redis command failed (``error``)
    FAIL_OPEN = "fail_open"  #: Redis failed, so the rebuild ran without it
    #: the primary failed (a failover, say), so a replica's copy was served
    REPLICA_HIT = "replica_hit"
    #: a blocking call on an event loop's thread found the key being rebuilt
    #: elsewhere: it did not wait (that would freeze the loop), it rebuilt alone
    NO_WAIT = "no_wait"
    #: a read of a missing key that reads do not fill (a lease taken by a read
    #: ended without a value, not long ago): a miss at once, without a lease
    UNFILLED = "unfilled"
    #: a fresh value was served from this process's near cache, without Redis
    NEAR_HIT = "near_hit"
    #: a near copy was dropped because the key changed in Redis (a write,
    #: delete, expiry or eviction, by any process)
    NEAR_INVALIDATION = "near_invalidation"
    #: a near copy was dropped to keep the near cache within its bounds
    NEAR_EVICTION = "near_eviction"
    #: every near copy was dropped at once: the invalidation connection was
    #: lost or replaced, or Redis was flushed (``key`` is ``""``)
    NEAR_FLUSH = "near_flush"
    #: Redis was found unreachable: for a short, growing pause, calls skip it
    #: (one probe at a time tries it); ``error`` is what failed (``key`` is ``""``)
    REDIS_DOWN = "redis_down"
    #: Redis answered again after :attr:`REDIS_DOWN` (``key`` is ``""``)
    REDIS_UP = "redis_up"
    #: under ``fail_open``, a write or removal Redis failed was not done; a
    #: removal (a write's: of the key it would have replaced) is owed to Redis
    #: and sent again until it takes it
    WRITE_DROPPED = "write_dropped"


@dataclass(frozen=True, slots=True)
class Event:
    """One observation about one key.

    Attributes:
        kind: what happened.
        key: the cache key, as the caller gave it (bytes keys decoded for display).
        duration: seconds, for ``REBUILD`` and ``WAIT``; otherwise ``None``.
        error: the exception, for ``REBUILD_ERROR`` and ``REDIS_ERROR``.
        namespace: the namespace of the instance that saw it: what metrics
            are labelled by (never by key, whose values are unbounded).
    """

    kind: EventKind
    key: str
    duration: float | None = None
    error: BaseException | None = None
    namespace: str = ""


EventHook = Callable[[Event], None]


def hook_from(setting: Any, argument: str = "on_event") -> EventHook | None:
    """An ``on_event`` hook from ``setting``: ``None``, a callable, its dotted
    path (``"stampede.prometheus.on_event"``), or a list of them, all called
    in order, one raising (logged) never keeping the others from the event.
    For configuration files; ``argument`` names the setting in errors.

    >>> sf = stampede.Stampede(client, on_event=stampede.hook_from([metrics, telemetry]))
    """
    if setting is None or callable(setting) or isinstance(setting, str):
        return _one_hook(setting, argument)
    if not isinstance(setting, (list, tuple)):
        raise ConfigurationError(
            f"{argument} must be a callable, its dotted path, or a list of them, got {setting!r}",
            field="on_event",
        )
    chain = tuple(_one_hook(item, f"{argument}[{index}]") for index, item in enumerate(setting))
    hooks = tuple(hook for hook in chain if hook is not None)
    if len(hooks) <= 1:
        return hooks[0] if hooks else None
    return _Chain(hooks)


class _Chain:
    """Hooks called in turn with each event."""

    __slots__ = ("hooks",)

    def __init__(self, hooks: tuple[EventHook, ...]) -> None:
        self.hooks = hooks

    def __call__(self, event: Event) -> None:
        for hook in self.hooks:
            try:
                hook(event)
            except Exception:
                # As the core does for a single hook: an observer never breaks
                # the cache it observes, nor the observers after it.
                logger.exception("on_event hook %r raised for %s on %r", hook, event.kind.value, event.key)

    # Equal for equal hooks: settings read again (Django builds a backend per
    # thread) compare equal to the first reading.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Chain) and other.hooks == self.hooks

    def __hash__(self) -> int:
        return hash(self.hooks)

    def __repr__(self) -> str:
        return f"stampede.hook_from({list(self.hooks)!r})"


def _one_hook(setting: Any, argument: str) -> EventHook | None:
    if isinstance(setting, str):
        module, _, name = setting.rpartition(".")
        try:
            setting = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigurationError(
                f"{argument} {setting!r} cannot be imported: {exc}", field="on_event"
            ) from exc
    if isinstance(setting, type):
        # Called with each event, a class would make an object of it: surely
        # not what was meant (stampede.prometheus.Metrics for a Metrics()).
        raise ConfigurationError(
            f"{argument} names the class {setting.__qualname__}: give an instance, or a function "
            "such as 'stampede.prometheus.on_event'",
            field="on_event",
        )
    if setting is not None and not callable(setting):
        raise ConfigurationError(
            f"{argument} must be a callable or its dotted path, got {setting!r}", field="on_event"
        )
    return setting  # type: ignore[no-any-return]
