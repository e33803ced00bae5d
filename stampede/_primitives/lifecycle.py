"""An instance's life, by flavour: closing its client, and a forked child process."""

from __future__ import annotations

import os
import weakref
from typing import Any

import redis.cluster
import redis.exceptions


async def async_close_client(client: Any) -> None:
    await client.aclose()


def close_client(client: Any) -> None:
    client.close()
    if isinstance(client, redis.cluster.RedisCluster):
        # redis-py's RedisCluster.close() leaves its nodes' pools open
        # (their clients were given a pool, so they do not own it).
        for node in client.get_nodes():  # type: ignore[no-untyped-call]
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()


# --- a forked child process -------------------------------------------------------


def async_forks_with(instance: Any) -> None:
    """Nothing: an event loop and its tasks do not come along into a forked
    child, and neither does an asyncio instance's use."""


_forking: weakref.WeakSet[Any] = weakref.WeakSet()


def forks_with(instance: Any) -> None:
    """Call ``instance._forked()`` in each child process forked from now on.
    Servers that load the application and then fork workers (gunicorn
    --preload, uWSGI without lazy-apps) hand each worker the instance."""
    _forking.add(instance)


def _after_fork_in_child() -> None:
    for instance in list(_forking):
        instance._forked()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_after_fork_in_child)
