"""Naive cache-aside, as most code writes it: ``GET``, and on a miss rebuild and ``SET``, values
pickled, nothing coordinating the callers. A peer of the side-by-side run, the batch floor of the
groups benchmark (one ``MGET``), and the way redis-py's client-side cache is driven."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from typing import Any, cast

import redis

from .._common.phase import Phase
from .base import SOCKET_TIMEOUT, Batch, BatchRebuild, PeerSpec, SyncPeer, SyncRebuild

__all__ = ["PEER", "NaivePeer", "PlainBatch", "naive_get"]


def naive_get(client: Any, key: str, ttl: int, rebuild: SyncRebuild) -> Any:
    """Cache-aside as most code writes it: no lock, every miss rebuilds. ``client``: redis-py's,
    with or without its client-side cache."""
    raw = cast("bytes | None", client.get(key))
    if raw is not None:
        return pickle.loads(raw)
    value = rebuild()
    client.set(key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=ttl)
    return value


class NaivePeer(SyncPeer):
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        return functools.partial(naive_get, self.client, phase.key, phase.ttl, rebuild)

    def write(self, phase: Phase, value: Any) -> None:
        self.client.set(phase.key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=phase.ttl)


PEER = PeerSpec(
    name="naive",
    label="naive cache-aside",
    short="naive cache-aside",
    modules=("redis",),
    distributions=("redis",),
    stale=False,
    config=(
        "`GET`; on a miss rebuild, then `SET key value EX ttl`; values pickled. One redis-py client "
        "per process, its pool shared by the 16 threads."
    ),
    open_sync=lambda at: NaivePeer(at.plain_client()),
    coherence=True,
    why={"rebuilds": "nothing coordinates the callers: each one that misses rebuilds"},
)


class PlainBatch(Batch):
    """Cache-aside on one ``MGET``, values pickled: no protection at all, the floor of a warm batch."""

    def __init__(self, url: str, *, ttl: int) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10.0)
        self.ttl = ttl

    def get_many(self, keys: list[str], rebuild_many: BatchRebuild) -> dict[str, Any]:
        raws = cast("list[bytes | None]", self.client.mget(keys))
        found = {key: pickle.loads(raw) for key, raw in zip(keys, raws, strict=True) if raw is not None}
        missing = [key for key in keys if key not in found]
        if missing:
            built = rebuild_many(missing)
            pipe = self.client.pipeline(transaction=False)
            for key, value in built.items():
                pipe.set(key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=self.ttl)
            pipe.execute()
            found.update(built)
        return found

    def close(self) -> None:
        self.client.close()
