"""Connections and cores shared by every backend instance with the same settings.

Django creates a backend instance per thread and per asyncio task and calls
``close()`` after every request: pools must outlive the instances.
"""

from __future__ import annotations

import threading

import stampede
import stampede.asyncio

from ._clients import async_client, sync_client
from ._config import CacheConfig
from ._errors import improperly_configured

__all__ = ["async_core", "sync_core"]

_lock = threading.Lock()
_sync: dict[CacheConfig, stampede.Stampede] = {}


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
                        sync_client(config, primary),
                        replicas=[sync_client(config, url) for url in replicas],
                        **config.core_kwargs(),
                    )
                except stampede.ConfigurationError as exc:
                    raise improperly_configured(exc) from exc
                _sync[config] = core
    return core


def async_core(config: CacheConfig) -> stampede.asyncio.Stampede:
    """The asyncio core for ``config`` on the running event loop."""

    def build() -> stampede.asyncio.Stampede:
        primary, *replicas = config.servers
        return stampede.asyncio.Stampede(
            async_client(config, primary),
            replicas=[async_client(config, url) for url in replicas],
            **config.core_kwargs(),
        )

    return stampede.asyncio.for_running_loop(config, build)
