"""A cluster or a Sentinel setup whose masters the failover tests kill."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

from stampede.testing import RedisCluster, RedisSentinel, RedisServer
from tests.helpers import wait_until

__all__ = ["Failing"]


class Failing:
    """A cluster or Sentinel setup whose master of a key can be killed."""

    def __init__(self, kind: str, binary: str | None) -> None:
        self.kind = kind
        self.setup: RedisCluster | RedisSentinel = (
            RedisCluster(binary=binary) if kind == "cluster" else RedisSentinel(binary=binary)
        )

    def __enter__(self) -> Failing:
        self.setup.start()
        if isinstance(self.setup, RedisCluster):
            for node in self.setup.nodes:
                with redis.Redis(port=node.port, socket_timeout=5) as client:
                    # As the documentation advises (During a failover): a cluster that marked a master
                    # failed refuses every read until the promotion otherwise,
                    # a replica's too.
                    client.config_set("cluster-allow-reads-when-down", "yes")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.setup.close()

    @property
    def url(self) -> str:
        url = self.setup.url
        return url.replace("redis://", "redis+cluster://") if self.kind == "cluster" else url

    def master_of(self, name: bytes) -> RedisServer:
        if isinstance(self.setup, RedisCluster):
            return self.setup.master_of(name)
        return self.setup.current_master()

    def kill_master_of(self, name: bytes) -> None:
        """Kill the master of ``name`` once its replicas have caught up, then
        return once a replica has taken over (bounded: the test fails after 30 s)."""
        wait_until(self.setup.in_sync, 10)
        victim = self.master_of(name)
        victim.stop()
        wait_until(lambda: self._promoted(name, victim), 30)

    def serve_through_failover(
        self, name: bytes, serve: Callable[[], None], threads: int
    ) -> list[BaseException]:
        """Call ``serve()`` in a loop in ``threads`` threads while the master of
        ``name`` is killed, until half a second after a replica took over; the
        exceptions the calls raised."""
        errors: list[BaseException] = []
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                try:
                    serve()
                except BaseException as exc:
                    errors.append(exc)

        running = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
        for thread in running:
            thread.start()
        try:
            self.kill_master_of(name)
            time.sleep(0.5)  # callers go on against the promoted master
        finally:
            stop.set()
            for thread in running:
                thread.join(30)
        return errors

    def kill_master_without_failover(self, name: bytes) -> None:
        """Kill the master of ``name`` with failover disabled: its replicas stay replicas."""
        wait_until(self.setup.in_sync, 10)
        if isinstance(self.setup, RedisCluster):
            for node in self.setup.nodes:
                with redis.Redis(port=node.port, socket_timeout=5) as client:
                    client.config_set("cluster-replica-no-failover", "yes")
        else:
            for sentinel in self.setup.sentinels:
                with redis.Redis(port=sentinel.port, socket_timeout=5) as client:
                    client.execute_command(
                        "SENTINEL SET", self.setup.service, "down-after-milliseconds", 3_600_000
                    )
        self.master_of(name).stop()

    def _promoted(self, name: bytes, victim: RedisServer) -> bool:
        try:
            return self.master_of(name) is not victim
        except (redis.RedisError, RuntimeError):
            return False
