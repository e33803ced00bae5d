"""Connections and cores shared by every backend instance with the same settings.

Django creates a backend instance per thread and per asyncio task and calls
``close()`` after every request: pools must outlive the instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from typing import Any

import stampede
import stampede.asyncio

from ._config import CacheConfig, improperly_configured

__all__ = ["async_core", "sync_core"]

_lock = threading.Lock()
_sync: dict[CacheConfig, stampede.Stampede] = {}
# redis.asyncio connections belong to one event loop.
_async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[CacheConfig, stampede.asyncio.Stampede]] = (
    weakref.WeakKeyDictionary()
)


def sync_core(config: CacheConfig) -> stampede.Stampede:
    """The blocking core for ``config``; built once per process."""
    core = _sync.get(config)
    if core is None:
        with _lock:
            core = _sync.get(config)
            if core is None:
                primary, *replicas = config.servers
                try:
                    core = stampede.Stampede(
                        config.sync_client(primary),
                        replicas=[config.sync_client(url) for url in replicas],
                        **config.core_kwargs(),
                    )
                except stampede.ConfigurationError as exc:
                    raise improperly_configured(exc) from exc
                _sync[config] = core
    return core


def async_core(config: CacheConfig) -> stampede.asyncio.Stampede:
    """The asyncio core for ``config`` on the running event loop."""
    loop = asyncio.get_running_loop()
    with _lock:
        _forget_closed_loops()
        cores = _async.setdefault(loop, {})
        core = cores.get(config)
        if core is None:
            primary, *replicas = config.servers
            core = cores[config] = stampede.asyncio.Stampede(
                config.async_client(primary),
                replicas=[config.async_client(url) for url in replicas],
                **config.core_kwargs(),
            )
    return core


def _forget_closed_loops() -> None:
    # Async views under WSGI run each request on a loop of its own
    # (async_to_sync), closed afterwards: its core can never be used again,
    # and its connections would keep it, and their sockets, alive.
    for loop in [loop for loop in _async if loop.is_closed()]:
        for core in _async.pop(loop).values():
            _close_sockets(core)


def _close_sockets(core: stampede.asyncio.Stampede) -> None:
    """Close the sockets of a core whose loop is closed (so cannot be awaited)."""
    pools = [core.client.connection_pool, *(replica.connection_pool for replica in core.replicas)]
    for pool in pools:
        for connection in [*pool._available_connections, *pool._in_use_connections]:
            transport: Any = getattr(getattr(connection, "_writer", None), "transport", None)
            sock = getattr(transport, "_sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
                # What transport.close() would record, had it a loop to run on.
                transport._sock = None
                transport._closing = True
            connection._reader = connection._writer = None
