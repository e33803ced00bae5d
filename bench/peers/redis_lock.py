"""redis-py's ``Lock`` around cache-aside: one caller rebuilds a missing key, the others wait for
the lock in turn to read it again."""

from __future__ import annotations

import contextlib
import functools
import pickle
from collections.abc import Callable
from typing import Any, cast

import redis

from .._common.phase import Phase
from .base import LOCK_TIMEOUT, WAIT_TIMEOUT, PeerSpec, SyncRebuild
from .naive import NaivePeer

__all__ = ["PEER", "RedisLockPeer", "locked_get"]


def locked_get(client: redis.Redis, key: str, ttl: int, rebuild: SyncRebuild) -> Any:
    """Cache-aside with redis-py's lock: one caller rebuilds a missing key, the others wait for it."""
    raw = cast("bytes | None", client.get(key))
    if raw is not None:
        return pickle.loads(raw)
    lock = client.lock(f"{key}:lock", timeout=LOCK_TIMEOUT, blocking_timeout=WAIT_TIMEOUT)
    if not lock.acquire():
        return rebuild()  # waited long enough: serve this caller, store nothing (it holds no lock)
    try:
        raw = cast("bytes | None", client.get(key))  # the holder before us may have stored it
        if raw is not None:
            return pickle.loads(raw)
        value = rebuild()
        client.set(key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=ttl)
        return value
    finally:
        # A lock that expired under a slow rebuild is not ours to release any more.
        with contextlib.suppress(redis.exceptions.LockError):
            lock.release()


class RedisLockPeer(NaivePeer):
    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        return functools.partial(locked_get, self.client, phase.key, phase.ttl, rebuild)


PEER = PeerSpec(
    name="redis-lock",
    label="redis-py `Lock` around cache-aside",
    short="redis-py Lock",
    modules=("redis",),
    distributions=("redis",),
    stale=False,
    config=(
        f"`GET`; on a miss `client.lock(key + ':lock', timeout={LOCK_TIMEOUT}, "
        f"blocking_timeout={WAIT_TIMEOUT})` (redis-py's `Lock`: a token under `SET NX PX`, retried "
        "every 0.1 s, its default `sleep`), `GET` again, rebuild, `SET EX ttl`, release (a Lua "
        "script). A caller that gives up waiting rebuilds for itself without storing. One client per "
        "process, as for naive."
    ),
    open_sync=lambda at: RedisLockPeer(at.plain_client()),
    why={
        "waiters": "waiters must each take the lock in turn to re-read the value, retrying every 0.1 s",
        "expiry": "with no stale value to serve, every caller of an expiry waits for the lock",
    },
)
