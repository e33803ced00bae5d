"""Which leases the current request holds: ``get`` hands one out on a miss,
the same request's ``set`` commits it.

A context variable, so each thread and each asyncio task has its own: a
task never commits or releases another's lease. Every change installs a
new dict, so a task never changes the leases of the context it came from.
"""

from __future__ import annotations

from contextvars import ContextVar

import stampede

__all__ = ["drop_all", "hold", "holds", "take"]

_held: ContextVar[dict[tuple[str, str], stampede.Lease]] = ContextVar("django_stampede_leases")


def hold(namespace: str, key: str, lease: stampede.Lease) -> None:
    _held.set({**_held.get({}), (namespace, key): lease})


def holds(namespace: str, key: str) -> bool:
    return (namespace, key) in _held.get({})


def take(namespace: str, key: str) -> stampede.Lease | None:
    """Remove and return this context's lease on ``key``, if any."""
    held = _held.get({})
    lease = held.get((namespace, key))
    if lease is not None:
        _held.set({name: other for name, other in held.items() if name != (namespace, key)})
    return lease


def drop_all(namespace: str) -> list[stampede.Lease]:
    """Remove and return this context's leases under ``namespace``."""
    held = _held.get({})
    mine = [lease for (space, _), lease in held.items() if space == namespace]
    if mine:
        _held.set({name: lease for name, lease in held.items() if name[0] != namespace})
    return mine
