"""Plain reads go to replicas; leases, writes and waits stay on the primary."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import stampede
from stampede.testing import RedisServer
from tests.helpers import wait_until


@pytest.fixture
def replica(server: RedisServer) -> Iterator[RedisServer]:
    with RedisServer(args=["--replicaof", "127.0.0.1", str(server.port)]) as own:
        yield own


def test_reads_are_served_by_a_replica_while_the_primary_is_frozen(
    server: RedisServer, replica: RedisServer
) -> None:
    primary_client = redis.Redis.from_url(server.url, socket_timeout=1)
    replica_client = redis.Redis.from_url(replica.url, socket_timeout=1)
    sf = stampede.Stampede(primary_client, replicas=[replica_client], namespace="replicated")
    sf.set("k", "v", ttl=60)
    wait_until(lambda: sf.get("k") is not None, timeout=30)  # replicated
    server.pause()
    try:

        def unreachable() -> str:
            raise AssertionError("a hit must not rebuild")

        assert sf.get("k").value == "v"
        assert sf.get_or_rebuild("k", unreachable, ttl=60) == "v"
        assert sf.get_many(["k"]) == {"k": "v"}
        assert sf.has_key("k") is True
    finally:
        server.resume()
        primary_client.close()
        replica_client.close()


def test_a_dead_replica_falls_back_to_another(server: RedisServer, replica: RedisServer) -> None:
    with RedisServer(args=["--replicaof", "127.0.0.1", str(server.port)]) as second:
        clients = [
            redis.Redis.from_url(url, socket_timeout=1) for url in (server.url, replica.url, second.url)
        ]
        sf = stampede.Stampede(clients[0], replicas=clients[1:], namespace="replicated")
        sf.set("k", "v", ttl=60)
        wait_until(lambda: all(client.exists(b"replicated:{k") for client in clients[1:]), timeout=30)
        second.stop()
        try:
            # Each read picks a replica at random: half would pick the dead one.
            for _ in range(20):
                assert sf.get("k").value == "v"
                assert sf.get_or_rebuild("k", lambda: "rebuilt", ttl=60) == "v"
        finally:
            for client in clients:
                client.close()
