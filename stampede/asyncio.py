"""The asyncio flavour: :class:`Stampede` on ``redis.asyncio``.

Same names and behaviour as :class:`stampede.Stampede`, as coroutines; it
runs the same machines (``stampede/_core/``). Rebuild functions may be
coroutine functions or plain callables; plain ones run in a worker thread so
that a slow rebuild never blocks the event loop.

An instance belongs to the event loop it is first used on, as its
``redis.asyncio`` connections do: used again under a second
``asyncio.run()``, its connections (of a loop now closed) fail with "Event
loop is closed". Make one per loop (inside the coroutine that
``asyncio.run`` runs, with ``async with``), or let :func:`for_running_loop`
keep one per loop for you.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

from ._async.stampede import Stampede as Stampede
from ._async.stampede import redis_client as redis_client
from ._primitives import close_sockets

__all__ = ["Stampede", "for_running_loop", "redis_client"]


# --- one instance per event loop -------------------------------------------------

_per_loop_lock = threading.Lock()
_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Stampede]] = (
    weakref.WeakKeyDictionary()
)


def for_running_loop(key: Hashable, factory: Callable[[], Stampede]) -> Stampede:
    """The instance made by ``factory`` for ``key`` on the running event loop.

    ``redis.asyncio`` connections belong to one loop, so frameworks that run
    async code on several loops (a loop per request under WSGI, a loop per
    thread) need one instance per loop. Instances of loops that have since
    closed are dropped and their sockets closed, so short-lived loops leave
    nothing behind.
    """
    loop = asyncio.get_running_loop()
    with _per_loop_lock:
        for closed in [other for other in _per_loop if other.is_closed()]:
            for instance in _per_loop.pop(closed).values():
                _abandon(instance)
        instances = _per_loop.setdefault(loop, {})
        if key not in instances:
            instances[key] = factory()
        return instances[key]


def _abandon(instance: Stampede) -> None:
    """Close the sockets of an instance whose loop is closed (so cannot be awaited)."""
    close_sockets(instance._subscriber.connections())  # its own node clients' too
    for client in _clients_of(instance):
        pool = getattr(client, "connection_pool", None)
        if pool is not None:
            connections = [*pool._available_connections, *pool._in_use_connections]
        else:  # a cluster client: a few connections per node, the first it asked included
            manager = client.nodes_manager
            nodes = {id(node): node for node in (*manager.startup_nodes.values(), *client.get_nodes())}
            connections = [c for node in nodes.values() for c in getattr(node, "_connections", ())]
            client._initialize = True  # what its aclose() records: it is closed, not leaked
        close_sockets(connections)


def _clients_of(instance: Stampede) -> list[Any]:
    """Every client an instance talks through: its own, its replicas, and the
    Sentinels a Sentinel-managed pool asks."""
    clients = [instance.client, *instance.replicas, *instance._server.standbys.made()]
    for client in list(clients):
        manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
        clients.extend(getattr(manager, "sentinels", ()))
    return clients
