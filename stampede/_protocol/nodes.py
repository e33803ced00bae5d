"""The nodes of a Redis Cluster: clients of one node, and whether the cluster
has sharded pub/sub.

A cluster broadcasts every classic ``PUBLISH`` over its bus to every node.
Redis 7 and Valkey have sharded pub/sub (``SPUBLISH``/``SSUBSCRIBE``): a
message stays within the shard that owns its channel's slot. A key's wake-up
channel shares the key's hash tag, so the scripts publish on the key's own
shard and a waiter subscribes there. Whether the servers have it is asked
once per client and remembered, so that a process's scripts and its
subscriber agree (and, the servers being the same, every process does).
"""

from __future__ import annotations

import weakref
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster

__all__ = ["node_client", "node_of", "record_sharded", "sharded_known"]

_sharded: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def sharded_known(client: Any) -> bool | None:
    """Whether ``client``'s cluster has sharded pub/sub; ``None``: not asked yet."""
    return _sharded.get(client)


def record_sharded(client: Any, server_info: dict[str, Any]) -> bool:
    """Remember what ``INFO server`` of one of ``client``'s nodes tells; return it.
    Valkey reports the Redis version it is compatible with."""
    version = str(server_info.get("redis_version", "0"))
    try:
        major = int(version.split(".", 1)[0])
    except ValueError:
        major = 0
    _sharded[client] = major >= 7
    return major >= 7


def node_client(cluster: Any, node: Any) -> Any:
    """A client of one node of ``cluster`` (blocking or asyncio, as ``cluster``
    is), connecting as the cluster connects to it. Not the cluster's own
    client of the node, which it drops, unclosed, when its topology changes:
    the caller closes this one."""
    if isinstance(cluster, redis.asyncio.cluster.RedisCluster):
        pool: Any = redis.asyncio.ConnectionPool(
            connection_class=node.connection_class, **node.connection_kwargs
        )
        return redis.asyncio.Redis.from_pool(pool)  # closes the pool with it
    template = cluster.get_redis_connection(cluster.get_default_node()).connection_pool
    pool = redis.ConnectionPool(
        connection_class=template.connection_class,
        **{**template.connection_kwargs, "host": node.host, "port": node.port},
    )
    return redis.Redis.from_pool(pool)


def node_of(client: Any, name: bytes) -> str | None:
    """The ``host:port`` of the primary that the cluster ``client`` sends the
    key ``name`` to, as it knows its slots now; ``None`` before it knows them
    (an asyncio client that has sent nothing yet)."""
    try:
        return str(client.nodes_manager.get_node_from_slot(client.keyslot(name)).name)
    except (redis.exceptions.RedisClusterException, redis.exceptions.RedisError, LookupError, AttributeError):
        return None
