# Generated from stampede/_async/operations.py by tools/unasync.py: edit that file, then run the tool.
"""The operations of a cache besides ``get_or_rebuild`` and the lease API, written once.

The asyncio source; the blocking twin is generated from it by
``python tools/unasync.py`` (``make lint`` checks that the two agree). The
driver supplies the I/O these build on: ``_shared_get`` (a GET shared by
concurrent callers) and ``_script`` (one script, errors translated, later
reads kept from sharing an older reply).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis.exceptions

from .._base import SWAP_BACKOFF, SWAP_MAX_BACKOFF, UNSET, StampedeBase, lost_connection
from .._core.envelope import Entry
from .._core.events import EventKind, logger
from .._core.flights import Turns
from .._core.flow import FAILOVER_BACKOFF
from .._core.keys import Keys
from .._exceptions import ConfigurationError, RedisUnavailableError, StampedeError
from .._redis.nodes import record_sharded, sharded_known

__all__ = ["Operations", "ask_sharded"]


def ask_sharded(client: Any) -> bool | None:
    """Whether the servers of the cluster ``client`` talks to have sharded
    pub/sub, asked once per client and remembered, so that the scripts and the
    subscriber of a process agree; ``None`` if Redis could not say."""
    known = sharded_known(client)
    if known is None:
        try:
            info = client.info("server", target_nodes=client.get_default_node())
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
            return None
        known = record_sharded(client, info)
    return known


class Operations(StampedeBase):
    """``get``, ``set``, ``delete``, ``invalidate``, ``add``, ``touch``, ``incr``,
    ``has_key``, the ``*_many`` calls, ``delete_prefix`` and ``clear``."""

    #: A lock per key for signed updates (a lock of the flavour's).
    _turns: Turns[Any]

    def _shared_get(self, name: bytes) -> bytes | None:
        raise NotImplementedError

    def _script(self, name: str, keys: Keys, args: list[Any]) -> Any:
        raise NotImplementedError

    def _pause(self, seconds: float) -> None:
        raise NotImplementedError

    def _ask_sharded(self) -> None:
        """On a cluster: whether its servers have sharded pub/sub (classic
        pub/sub until known; asked again at the next call if Redis failed)."""
        self._sharded = ask_sharded(self._client)

    def _scripts_now(self) -> dict[str, Any]:
        return self._sharded_scripts if self._sharded else self._scripts

    def _reread(self, keys: Keys) -> bytes | None:
        """GET the value from the primary, errors translated."""
        with self._redis_errors(keys.name, "read"):
            raw: bytes | None = self._client.get(keys.value)
            return raw

    def _standby_get(self, keys: Keys) -> bytes | None:
        """The value as a replica holds it, for when the primary fails: the
        first replica that answers, or ``None`` (no replica, none answers)."""
        return (self._standby_read(keys))[1]

    def _standby_read(self, keys: Keys) -> tuple[bool, bytes | None]:
        """Whether a replica answered, and what it holds under ``keys``."""
        for client, readonly in self._standbys(keys.value):
            try:
                if readonly:
                    with client.pipeline(transaction=False) as pipe:
                        pipe.execute_command("READONLY")
                        pipe.get(keys.value)
                        raw = (pipe.execute())[1]
                else:
                    raw = client.get(keys.value)
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
                logger.debug("replica read of %r failed: %s", keys.name, exc)
                continue
            return True, raw
        return False, None

    def get(self, key: str | bytes) -> Entry | None:
        """The stored entry of ``key`` (value, freshness, age), or ``None``.

        A plain read: no lease, no rebuild, no waiting. When the primary
        fails, a replica's copy is returned if one answers; where none does
        and the primary can fail over (a cluster, Sentinel), it is asked
        again until a replica is promoted, within ``wait_timeout``.
        """
        keys = self._keys(key)
        try:
            raw = self._shared_get(keys.value)
        except redis.exceptions.RedisError as exc:
            lookup = self._read_failed(keys, exc)
            if lookup.error is None:
                return None
            answered, raw = self._standby_read(keys)
            if not answered:
                return self._decode(keys, (self._outlast_failover(lookup.error, [keys]))[0])
            entry = self._decode(keys, raw)
            if entry is None:
                raise lookup.error from exc  # the replica has nothing: no copy to serve
            self._emit(keys, EventKind.REPLICA_HIT)
            return entry
        return self._decode(keys, raw)

    def _outlast_failover(self, error: RedisUnavailableError, names: list[Keys]) -> list[Any]:
        """Neither the primary nor a replica answered: where the primary can
        fail over, read ``names`` again (the primary, then replicas) with
        backoff until one answers, within ``wait_timeout``; else raise ``error``."""
        if self._fails_over:
            deadline = self._clock.monotonic() + self.options.wait_timeout
            pause = 0.05
            while self._clock.monotonic() + pause < deadline:
                self._pause(pause)
                pause = min(pause * 2, FAILOVER_BACKOFF)
                reader = self._client
                try:
                    mget = getattr(reader, "mget_nonatomic", reader.mget)
                    raws: list[Any] = mget([keys.value for keys in names])
                    return raws
                except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                    pass
                except AttributeError as exc:
                    if lost_connection(exc) is None:
                        raise
                answers = [self._standby_read(keys) for keys in names]
                if any(answered for answered, _ in answers):
                    for keys, (_, raw) in zip(names, answers, strict=True):
                        if raw is not None:
                            self._emit(keys, EventKind.REPLICA_HIT)
                    return [raw for _, raw in answers]
        raise error

    def set(
        self, key: str | bytes, value: Any, *, ttl: float | None = UNSET, stale_ttl: float = UNSET
    ) -> None:
        """Store ``value`` under ``key`` now, wake any waiters, and cancel any
        rebuild in flight (its write would be older than this one)."""
        options = self._call_options(ttl=ttl, stale_ttl=stale_ttl)
        keys = self._keys(key)
        self._script("write", keys, self._write_args(keys, value, options))

    def delete(self, key: str | bytes) -> bool:
        """Remove ``key`` at once; the next read rebuilds it. Cancels any rebuild
        in flight. Returns whether there was a value."""
        keys = self._keys(key)
        return bool(self._script("write", keys, self._delete_args(keys)))

    def invalidate(self, key: str | bytes) -> bool:
        """Mark ``key`` stale but keep serving it while one caller refreshes it.

        Cancels any rebuild in flight, which may have read the data being
        invalidated. Returns whether there was a value to mark.
        """
        keys = self._keys(key)
        return bool(self._script("invalidate", keys, self._invalidate_args()))

    def add(
        self, key: str | bytes, value: Any, *, ttl: float | None = UNSET, stale_ttl: float = UNSET
    ) -> bool:
        """Store ``value`` only if ``key`` holds nothing; returns whether it did."""
        options = self._call_options(ttl, stale_ttl)
        keys = self._keys(key)
        return bool(self._script("add", keys, self._write_args(keys, value, options)))

    def touch(self, key: str | bytes, *, ttl: float | None = UNSET, stale_ttl: float = UNSET) -> bool:
        """Give the value of ``key`` a new ``ttl`` from now; returns whether there was one."""
        options = self._call_options(ttl, stale_ttl)
        keys = self._keys(key)
        if self._codec.signer is not None:
            return self._swap(keys, lambda raw: self._retimed(keys, raw, options)) is not None
        return bool(self._script("touch", keys, self._touch_args(options)))

    def incr(self, key: str | bytes, delta: int = 1) -> int | None:
        """Add ``delta`` to the integer stored under ``key``, keeping its expiry.

        Returns the new value, or ``None`` if there is none. Raises
        ``TypeError`` if the value is not an integer and ``OverflowError``
        outside the signed 64-bit range.
        """
        keys = self._keys(key)
        args = self._incr_args(delta)
        if self._codec.signer is not None:
            swapped = self._swap(keys, lambda raw: (self._incremented(keys, raw, delta)[0], ""))
            return None if swapped is None else self._incremented(keys, swapped, delta)[1]
        return self._incr_result(keys, self._script("incr", keys, args))

    def _swap(self, keys: Keys, change: Callable[[bytes], tuple[bytes, str]]) -> bytes | None:
        """Replace the signed value of ``keys`` with ``change(value)`` (the new
        bytes and SWAP's expiry argument) by compare-and-set, as only this side
        can sign it. Returns the value it changed, or ``None`` when there was
        none that verifies."""
        # Callers of this process take turns; only other processes' writes
        # can make a swap fail.
        turn = self._turns.take(keys.value)
        try:
            with turn:
                return self._swap_in_turn(keys, change)
        finally:
            self._turns.give_back(keys.value)

    def _swap_in_turn(self, keys: Keys, change: Callable[[bytes], tuple[bytes, str]]) -> bytes | None:
        raw = self._reread(keys)
        deadline = self._clock.monotonic() + self.options.wait_timeout
        pause = SWAP_BACKOFF
        while True:
            if raw is None or self._decode(keys, raw) is None:  # absent, or forged: a miss
                return None
            new, expire = change(raw)
            reply = self._script("swap", keys, [raw, new, expire])
            if not isinstance(reply, list):
                return raw
            if self._clock.monotonic() + pause > deadline:
                raise StampedeError(
                    f"key {keys.name!r} kept changing under this update for wait_timeout "
                    f"({self.options.wait_timeout:g}s)"
                )
            # Another process's write came first: try again after a random
            # pause, so that updaters in many processes do not keep colliding,
            # from the value as it is after the pause (the one the refusal
            # carried is older by then: retried with it, a loser would never
            # win while others keep writing).
            self._pause(random.uniform(0, pause))
            pause = min(pause * 2, SWAP_MAX_BACKOFF)
            raw = self._reread(keys)

    def has_key(self, key: str | bytes) -> bool:
        """Whether ``key`` holds a value, fresh or stale."""
        keys = self._keys(key)
        with self._redis_errors(keys.name, "check"):
            return bool(self._reader().exists(keys.value))

    def get_many(self, keys: Iterable[str | bytes]) -> dict[Any, Any]:
        """The values (fresh or stale) of those ``keys`` that have one, in one round trip."""
        named = self._many(keys)
        if not named:
            return {}
        reader = self._reader()
        mget = getattr(reader, "mget_nonatomic", reader.mget)  # Redis Cluster: per slot
        try:
            with self._redis_errors("", "read several keys"):
                raws = mget(list(named))
        except RedisUnavailableError as error:
            # The primary failed: what replicas hold, key by key (their slots'
            # replicas on a cluster), if any replica answers at all.
            answers = [self._standby_read(names) for _, names in named.values()]
            if any(answered for answered, _ in answers):
                raws = [raw for _, raw in answers]
                for (_, names), raw in zip(named.values(), raws, strict=True):
                    if raw is not None:
                        self._emit(names, EventKind.REPLICA_HIT)
            else:
                raws = self._outlast_failover(error, [names for _, names in named.values()])
        return self._found_many(named, raws)

    def set_many(
        self, mapping: Mapping[Any, Any], *, ttl: float | None = UNSET, stale_ttl: float = UNSET
    ) -> None:
        """:meth:`set` for every item, in one round trip."""
        options = self._call_options(ttl, stale_ttl)
        calls = [(names, self._write_args(names, value, options)) for names, value in self._items(mapping)]
        self._pipelined("write", calls)

    def delete_many(self, keys: Iterable[str | bytes]) -> int:
        """:meth:`delete` for every key, in one round trip; returns how many held a value."""
        calls = [(names, self._delete_args(names)) for _, names in self._many(keys).values()]
        return sum(self._pipelined("write", calls))

    def _pipelined(self, script: str, calls: list[tuple[Keys, list[Any]]]) -> list[Any]:
        if not calls:
            return []
        try:
            return self._pipelined_once(script, calls)
        finally:
            self._wrote(script, *(names for names, _ in calls))

    def _pipelined_once(self, script: str, calls: list[tuple[Keys, list[Any]]]) -> list[Any]:
        with self._redis_errors("", f"{script} several keys"):
            results = self._pipeline(script, calls, by_source=False)
            again = self._unscripted(results)
            retried = self._pipeline(script, [calls[i] for i in again], by_source=True) if again else []
            return self._pipeline_results(results, again, retried)

    def _pipeline(self, script: str, calls: list[tuple[Keys, list[Any]]], *, by_source: bool) -> list[Any]:
        if self._cluster:
            # redis-py's cluster pipeline takes no scripts: one call per key,
            # each routed (MOVED, ASK) by redis-py, errors kept in place.
            results: list[Any] = []
            for names, args in calls:
                try:
                    if self._sharded is None:
                        self._ask_sharded()
                    results.append(self._scripts_now()[script](keys=names.script_keys, args=args))
                except redis.exceptions.RedisError as exc:
                    results.append(exc)
            return results
        pipe = self._client.pipeline(transaction=False)
        self._queue_scripts(pipe, script, calls, by_source=by_source)
        return pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key that starts with ``prefix`` (``SCAN``); returns how many.

        For invalidating a family of keys, such as every call of a function.
        """
        if not isinstance(prefix, str) or not prefix:
            raise ConfigurationError(f"prefix must be a non-empty str, got {prefix!r}")
        return self._unlink_matching(self._keys.prefix_pattern(prefix))

    def clear(self) -> int:
        """Delete every key of this namespace (values, leases, fences); returns how many values.

        Walks the keyspace with ``SCAN``: cost grows with the database, not
        with the namespace.
        """
        return self._unlink_matching(self._keys.pattern)

    def _unlink_matching(self, pattern: bytes) -> int:
        deleted = 0
        with self._redis_errors("", "delete keys by pattern"):
            batch: list[bytes] = []
            for name in self._client.scan_iter(match=pattern, count=1000):
                batch.append(name)
                if len(batch) == 500:
                    deleted += self._unlink(batch)
                    batch = []
            if batch:
                deleted += self._unlink(batch)
        return deleted

    def _unlink(self, names: list[bytes]) -> int:
        """Delete ``names``; returns how many were values (not leases or fences)."""
        values, others, fenced = self._unlink_plan(names)
        if others:
            self._client.unlink(*others)
        deleted = int(self._client.unlink(*values)) if values else 0
        if values and self._near is not None:
            self._near.invalidate(values)  # this process sees its own deletes at once
        if fenced:
            calls = [(keys, self._delete_args(keys)) for keys in fenced]
            deleted += sum(self._pipelined("write", calls))
        return deleted
