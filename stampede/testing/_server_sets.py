"""What the server sets (a cluster, a Sentinel deployment) share, and the commands they use to settle."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from ._closing import ClosedOnExit
from ._redis_servers import RedisServer

_S = TypeVar("_S", bound="ServerSet")


class ServerSet(ClosedOnExit):
    """What a set of :class:`RedisServer` processes started together shares:
    stopping, closing, and ``with`` (which starts them)."""

    def _servers(self) -> list[RedisServer]:
        raise NotImplementedError

    def _masters(self) -> list[RedisServer]:
        raise NotImplementedError

    def in_sync(self) -> bool:
        """Whether every replica has all its master wrote (a write's last step
        before a failover can keep it)."""
        for master in self._masters():
            with redis.Redis(port=master.port, socket_timeout=5) as client:
                if not replicated(client):
                    return False
        return True

    def start(self, timeout: float = 30.0) -> ServerSet:
        raise NotImplementedError

    def stop(self) -> None:
        for server in self._servers():
            server.stop()

    def close(self) -> None:
        for server in self._servers():
            server.close()

    def __enter__(self: _S) -> _S:
        self.start()
        return self


def command(client: redis.Redis, *args: object) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def text(reply: object) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def replicated(client: redis.Redis) -> bool:
    """Every replica of the server ``client`` talks to has all it wrote."""
    info = client.info("replication")
    offsets = [value["offset"] for key, value in info.items() if key.startswith("slave")]
    return bool(offsets) and all(offset == info["master_repl_offset"] for offset in offsets)


def wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cluster did not settle within {timeout}s")
        time.sleep(0.05)
