"""A local Redis Sentinel deployment: a master, its replicas and the sentinels watching them."""

from __future__ import annotations

import redis

from ._redis_servers import RedisServer
from ._server_sets import ServerSet, command, wait_for


class RedisSentinel(ServerSet):
    """A local Sentinel setup: a master, ``replicas`` replicas and ``sentinels``
    Sentinels (quorum: a majority) watching it as ``service``.

    >>> with RedisSentinel() as setup:
    ...     sentinel = redis.sentinel.Sentinel(setup.sentinel_addresses)
    ...     client = sentinel.master_for(setup.service)

    ``down_after_ms``: how soon the Sentinels call a silent master down.
    """

    def __init__(
        self,
        replicas: int = 1,
        sentinels: int = 3,
        *,
        service: str = "mymaster",
        binary: str | None = None,
        down_after_ms: int = 1000,
    ) -> None:
        self.service = service
        self.master = RedisServer(binary=binary)
        self.replicas = [
            RedisServer(args=["--replicaof", "127.0.0.1", str(self.master.port)], binary=binary)
            for _ in range(replicas)
        ]
        quorum = sentinels // 2 + 1
        config = (
            f"sentinel monitor {service} 127.0.0.1 {self.master.port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {max(3 * down_after_ms, 3000)}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
        self.sentinels = [
            RedisServer(args=["--sentinel"], binary=binary, config=config) for _ in range(sentinels)
        ]

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", sentinel.port) for sentinel in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://`` URL of the service, as :meth:`stampede.Stampede.from_url` takes it."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self, timeout: float = 30.0) -> RedisSentinel:
        """Start the servers, then the Sentinels, and wait until every Sentinel knows
        the master, its replicas and the other Sentinels."""
        try:
            self.master.start()
            for server in (*self.replicas, *self.sentinels):
                server.start()
            clients = [redis.Redis(port=sentinel.port, socket_timeout=5) for sentinel in self.sentinels]
            try:
                wait_for(lambda: all(self._settled(client) for client in clients), timeout)
            finally:
                for client in clients:
                    client.close()
        except BaseException:
            self.stop()
            raise
        return self

    def current_master(self) -> RedisServer:
        """The server the Sentinels name as master now (after a failover: the promoted replica)."""
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            with redis.Redis(port=sentinel.port, socket_timeout=5) as client:
                _, port = command(client, "SENTINEL GET-MASTER-ADDR-BY-NAME", self.service)
                return next(server for server in (self.master, *self.replicas) if server.port == int(port))
        raise RuntimeError("no Sentinel is running")

    def _settled(self, client: redis.Redis) -> bool:
        replicas = command(client, "SENTINEL REPLICAS", self.service)
        others = command(client, "SENTINEL SENTINELS", self.service)
        return len(replicas) == len(self.replicas) and len(others) == len(self.sentinels) - 1

    def _servers(self) -> list[RedisServer]:
        return [*self.sentinels, *self.replicas, self.master]  # the watchers first

    def _masters(self) -> list[RedisServer]:
        return [self.current_master()]
