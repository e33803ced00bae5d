"""The leases a request holds: ``get`` takes one on a miss, the same request's
``set`` commits it, and whatever is left is settled when the request ends.

One container per request, made at ``request_started`` in the request's own
context, so every task and ``sync_to_async`` thread working for the request
shares it, and ``request_finished`` (which Django's ASGI handler sends from
the parent context, not from the view's task) still finds it. Outside a
request (scripts, workers), a container is made for the current context on
first use. Never shared between requests or unrelated tasks.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from stampede import Lease

from ._config import CacheConfig
from ._registry import sync_core

__all__ = ["begin_request", "defer", "end_request", "forget_all", "hold", "holds", "take", "take_deferred"]


class _Held:
    __slots__ = ("deferred", "leases")

    def __init__(self) -> None:
        self.leases: dict[tuple[CacheConfig, str], Lease] = {}
        # Header lists whose commit waits for their page: (config, lease, value, ttl).
        self.deferred: list[tuple[CacheConfig, Lease, Any, int | None]] = []


_current: ContextVar[_Held] = ContextVar("django_stampede_held")


def _mine() -> _Held:
    held = _current.get(None)
    if held is None:
        held = _Held()
        _current.set(held)
    return held


def hold(config: CacheConfig, key: str, lease: Lease) -> None:
    _mine().leases[config, key] = lease


def holds(config: CacheConfig, key: str) -> bool:
    held = _current.get(None)
    return held is not None and (config, key) in held.leases


def take(config: CacheConfig, key: str) -> Lease | None:
    """Remove and return this request's lease on ``key``, if any."""
    held = _current.get(None)
    return None if held is None else held.leases.pop((config, key), None)


def forget_all(config: CacheConfig) -> None:
    """Forget this request's leases and deferred writes for ``config`` (its ``clear()``)."""
    held = _current.get(None)
    if held is not None:
        for name in [name for name in held.leases if name[0] == config]:
            del held.leases[name]
        held.deferred = [item for item in held.deferred if item[0] != config]


def defer(config: CacheConfig, lease: Lease, value: Any, ttl: int | None) -> None:
    _mine().deferred.append((config, lease, value, ttl))


def take_deferred(config: CacheConfig) -> list[tuple[Lease, Any, int | None]]:
    held = _current.get(None)
    if held is None or not held.deferred:
        return []
    mine = [(lease, value, ttl) for owner, lease, value, ttl in held.deferred if owner == config]
    held.deferred = [item for item in held.deferred if item[0] != config]
    return mine


def begin_request(**kwargs: Any) -> None:
    """``request_started`` receiver: a fresh container for the request."""
    _current.set(_Held())


def end_request(**kwargs: Any) -> None:
    """``request_finished`` receiver: store the header lists still waiting for
    their page, and free the leases of misses the request never set (its
    view raised, or chose not to cache) so that others rebuild at once."""
    held = _current.get(None)
    if held is None:
        return
    deferred, held.deferred = held.deferred, []
    leases, held.leases = held.leases, {}
    for config, lease, value, ttl in deferred:
        sync_core(config).commit(lease, value, ttl=ttl, store_if_lapsed=True)
    for (config, _), lease in leases.items():
        sync_core(config).release(lease)
