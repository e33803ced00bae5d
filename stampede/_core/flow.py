"""One key's rebuild across processes, written once and free of I/O.

:class:`Flow` is a generator that yields operations (see
:mod:`~stampede._core.ops`: take the lease, wait for its holder, rebuild,
commit, release...) and receives their results; the drivers of both
flavours carry them out, so there is one copy of the logic, testable without
Redis or a real clock. A driver reports a failed Redis operation by throwing
:class:`~stampede.RedisUnavailableError` into the generator. What a caller
is given when something fails is decided in :mod:`~stampede._core.policy`.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable, Generator
from typing import Any

from .._exceptions import RedisUnavailableError, SerializationError, WaitTimeoutError
from . import policy
from .clock import Clock
from .codec import Codec, envelope_of
from .envelope import Entry
from .events import EventKind, logger
from .keys import Keys
from .memos import BusyLeases, FailedKeys, KeptAlone, UnfilledKeys
from .ops import (
    Acquire,
    Acquired,
    Capture,
    Commit,
    Lookup,
    Op,
    ReadTags,
    Rebuild,
    Rebuilt,
    Refused,
    Release,
    Reread,
    Standby,
    Wait,
    Waited,
)
from .options import Options
from .tags import UNTAGGED
from .unstored import Unstored

__all__ = ["Flow", "new_token"]


def new_token() -> str:
    """A lease token: 128 random bits, never reused."""
    return secrets.token_hex(16)


_Outcome = tuple[Any, BaseException | None]


class Flow:
    """One ``get_or_rebuild`` call of one key, past the fresh hit.

    Args:
        keys: the Redis names of the key.
        options: the call's effective options.
        codec: encodes the rebuilt value (its serializer, its signer).
        decode: raw bytes (or ``None``) to an :class:`Entry`, ``None`` when
            missing or unreadable.
        clock: time source.
        emit: reports an event about this key.
        background: this flow runs detached; its caller was already served.
        take_over: when a lease is freed without a value, compete for it
            again (``get_or_rebuild``) rather than go on alone (``read``).
        can_wait: whether this caller may wait for someone else's rebuild;
            not on an event loop's thread, where waiting would freeze the
            loop (and the very coroutine holding the lease).
        deadline: the monotonic time at which waiting ends, if the caller
            already waited before this flow began.
        missed: this call was already reported as a miss (it waited for
            another caller of its process first).
        busy: the process's :class:`BusyLeases`, consulted before a stale
            value's lease is asked for.
        unfilled_keys: the process's :class:`UnfilledKeys`, told of a key a
            read found marked as one that reads do not fill.
        tags: the ids of the tags the rebuilt value carries.
        fails_over: the primary can be replaced (a Redis Cluster, a
            Sentinel-managed master): when it fails, a replica's value is
            served, and a caller with nothing to serve tries the primary
            again until ``wait_timeout`` (a promotion) rather than fail at once.
    """

    def __init__(
        self,
        keys: Keys,
        options: Options,
        codec: Codec,
        decode: Callable[[bytes | None], Entry | None],
        clock: Clock,
        emit: Callable[..., None],
        *,
        background: bool = False,
        take_over: bool = True,
        can_wait: bool = True,
        deadline: float | None = None,
        fails_over: bool = False,
        missed: bool = False,
        busy: BusyLeases | None = None,
        unfilled_keys: UnfilledKeys | None = None,
        failed_keys: FailedKeys | None = None,
        kept: KeptAlone | None = None,
        tags: tuple[bytes, ...] = (),
        unknown: Callable[[bytes | None], list[bytes]] | None = None,
    ) -> None:
        self.keys = keys
        self.options = options
        self.codec = codec
        self.decode = decode
        self.clock = clock
        self.emit = emit
        self.background = background
        self.take_over = take_over
        self.can_wait = can_wait
        self.deadline = deadline
        self.fails_over = fails_over
        self.missed = missed
        self.busy = busy
        self.unfilled_keys = unfilled_keys
        self.failed_keys = failed_keys
        self.kept = kept
        self.tags = tags
        self.unknown = unknown
        #: What the value rebuilt records of its groups (see :class:`Capture`).
        self.captured = UNTAGGED
        self.committed = False  # set by settle(): whether a rebuilt value was stored
        self.won_at: str | None = None  # the server's clock when this flow won its lease
        self.failures = 0  # the rebuilds of the key that raised in a row, as its lease said
        self.unfilled = False  # found the key marked as one that reads do not fill
        self.failed_open = False  # Redis failed: rebuilt without it (fail_open)
        #: Whether what was rebuilt without Redis is kept in the process for
        #: the key's next callers (see policy.keeps_alone).
        self.keeps_alone = False
        # Its rebuild lost to a newer write (the commit was refused): its value
        # is for its own caller only, who asked before that write.
        self.superseded = False

    def run(self, lookup: Lookup) -> Generator[Op, Any, Any]:
        """Serve, refresh or rebuild the key; returns the value or raises."""
        try:
            if lookup.error is not None:
                found = yield from self._through_failover(lookup.error)
                if isinstance(found, Entry):
                    return found.value
                lookup = found
            if lookup.entry is not None:
                outcome = yield from self._refresh(lookup.entry)
            else:
                outcome = yield from self._fill(lookup.fallback, lookup.fallback_raw)
        except RedisUnavailableError as exc:
            # Stale-if-error: the stale value, or one kept for errors alone.
            stale = lookup.entry if lookup.entry is not None else lookup.fallback
            fallback = policy.on_redis_failure(
                self.keys.name, exc, stale=stale is not None, options=self.options, emit=self.emit
            )
            if fallback is policy.Fallback.STALE:
                assert stale is not None
                outcome = self._served_on_error(stale)
            else:
                outcome = yield from self._without_redis(exc)
        value, error = outcome
        if error is not None:
            raise error
        return value

    def _judged(self, raw: bytes | None) -> Generator[Op, Any, Entry | None]:
        """What ``raw`` (read in the middle of the flow: a value that landed,
        a newer write) holds, judged as a first read is: the tag states it
        records that were not read within ``tag_check_interval`` (or were
        found lost) are read (and made) first. A value committed just now
        records the states its rebuild captured before it began; judged by
        older states held here, it would be served after an invalidation
        of its tags that this caller came after."""
        unknown = self.unknown(raw) if self.unknown is not None and raw is not None else None
        if unknown:
            yield ReadTags(tuple(unknown))
        return self.decode(raw)

    def _without_redis(self, error: RedisUnavailableError) -> Generator[Op, Any, _Outcome]:
        """Redis failed, under fail_open: what this process rebuilt or wrote of
        the key while Redis was away, if it is still fresh; else a rebuild
        without Redis, kept for the next callers where the policy keeps it
        (:func:`~stampede._core.policy.keeps_alone`)."""
        self.failed_open = True
        kept, now = (self.kept if policy.keeps_alone(error) else None), self.clock.monotonic()
        self.keeps_alone = kept is not None
        if kept is not None:
            found, value = kept.get(self.keys.value, now, skipped=error.skipped)
            if found:
                return value, None
            held = self.decode(kept.copy(self.keys.value))
            if held is not None and self.clock.time() < held.fresh_until + self.options.stale_ttl:
                # The near copy held since the link was lost, within its stale window.
                if not held.is_fresh(self.clock.time()):
                    self.emit(EventKind.STALE_HIT)
                return held.value, None
        value, failed = yield from self._alone()
        if failed is None and kept is not None and self.take_over:
            kept.keep(self.keys.value, value, now, self.options.ttl)
        return value, failed

    def _through_failover(self, error: RedisUnavailableError) -> Generator[Op, Any, Entry | Lookup]:
        """The first read failed: a replica's value to serve, or (where the
        primary can fail over) what the primary has once it answers again."""
        entry = self.decode((yield Standby()))
        if entry is not None:
            # stale-if-error from a replica: whatever it holds is no older than
            # what this caller could have had, and beats an error.
            logger.info("Redis failed reading %r; serving a replica's value: %s", self.keys.name, error)
            self.emit(EventKind.REPLICA_HIT)
            return entry
        raw = yield from self._failover().until_primary(Reread(), error)
        entry = yield from self._judged(raw)
        if entry is not None and entry.is_fresh(self.clock.time()):
            self.emit(EventKind.HIT)
            return entry
        return Lookup(entry)

    def _failover(self) -> policy.Failover:
        """How this call outlasts a failing primary: within its waiting time,
        which starts at its first wait."""
        if self.deadline is None:
            self.deadline = self.clock.monotonic() + self.options.wait_timeout
        return policy.Failover(self.fails_over, self.options, self.clock, self.deadline)

    def after_wait_timeout(self) -> Generator[Op, Any, Any]:
        """What a caller does once it has waited ``wait_timeout`` in vain."""
        policy.on_wait_timeout(self.keys.name, self.options, self.emit)
        value, error = yield from self._alone()
        if error is not None:
            raise error
        return value

    def without_waiting(self) -> Generator[Op, Any, Any]:
        """What a caller that may not wait does instead: rebuild alone, unstored."""
        value, error = yield from self._no_wait()
        if error is not None:
            raise error
        return value

    def _no_wait(self) -> Generator[Op, Any, _Outcome]:
        self.emit(EventKind.NO_WAIT)
        logger.debug("not waiting for the rebuild of %r on an event loop's thread", self.keys.name)
        return (yield from self._alone())

    def _alone(self) -> Generator[Op, Any, _Outcome]:
        # A rebuild without the lease, for this caller only. Not stored:
        # nothing fences this write, and a rebuild that read its data before
        # a newer commit (or a set, delete or invalidate) would overwrite it.
        rebuilt: Rebuilt = yield Rebuild(None)
        self._report(rebuilt)
        value = rebuilt.value
        return (value.value if isinstance(value, Unstored) else value), rebuilt.error

    def _refresh(self, entry: Entry) -> Generator[Op, Any, _Outcome]:
        # A stale (or early-refresh) value is in hand: whoever loses the
        # lease race serves it at once.
        busy = self.busy
        name = self.keys.value
        if busy is not None and busy.held(name, self.clock.monotonic(), entry):
            # Another caller refreshes it, as this process found out moments ago.
            return self._served_stale(entry)
        token = new_token()
        acquired = yield from self._acquire(token)
        if not acquired.won:
            if busy is not None:
                busy.note(name, self.clock.monotonic(), acquired.lease_pttl, entry)
            return self._served_stale(entry)
        if busy is not None:
            busy.forget(name)
        self.emit(EventKind.LEASE_WON)
        current = yield from self._judged(acquired.current)
        if (
            current is not None
            and current.created_at > entry.created_at
            and current.is_fresh(self.clock.time())
        ):
            # Refreshed by someone else between our read and our lease.
            yield Release(token)
            return current.value, None
        return (yield from self._rebuild_and_commit(token, entry))

    def _served_stale(self, entry: Entry) -> _Outcome:
        if not self.background:
            fresh = entry.is_fresh(self.clock.time())
            self.emit(EventKind.HIT if fresh else EventKind.STALE_HIT)
        return entry.value, None

    def _served_on_error(self, entry: Entry) -> _Outcome:
        """``entry``, served because what would replace it failed (stale-if-error)."""
        if not self.background:
            self.emit(EventKind.STALE_HIT)
        return entry.value, None

    def _backed_off(self, said: Acquired, fallback: Entry | None) -> _Outcome:
        """The key's last rebuild raised, too recently to try again: the value
        kept for errors, if there is one, else that error at once."""
        if fallback is not None:
            return self._served_on_error(fallback)
        return None, policy.on_backoff(self.keys.name, said)

    def _fill(
        self, fallback: Entry | None = None, fallback_raw: bytes | None = None
    ) -> Generator[Op, Any, _Outcome]:
        # Nothing to serve: one caller rebuilds, the others wait for it. A
        # value kept for errors alone (stale_if_error) is served only if the
        # rebuild fails; until then it has not landed.
        if not self.missed:
            self.emit(EventKind.MISS)
            self.missed = True
        clock = self.clock
        failover = self._failover()
        deadline = failover.deadline
        unusable = fallback_raw
        pause = policy.FAILOVER_FIRST_PAUSE  # between tries of a primary that is failing over
        if self.take_over and self.failed_keys is not None:
            # Its last rebuild raised, as this process found out moments ago.
            known = self.failed_keys.known(self.keys.value, clock.monotonic())
            if known is not None:
                return self._backed_off(known[1], fallback)
        while True:
            token = new_token()
            try:
                acquired = yield from self._acquire(token)
            except RedisUnavailableError as exc:
                pause = yield from failover.pause(exc, pause)
                continue
            if acquired.failed is not None:
                # Its last rebuild raised, moments ago: that error, at once.
                if self.failed_keys is not None:
                    self.failed_keys.note(self.keys.value, clock.monotonic(), acquired.lease_pttl, acquired)
                return self._backed_off(acquired, fallback)
            if acquired.unfilled:
                # A key that reads do not fill (nobody wrote it after the last
                # read that took its lease): a miss at once, for this caller alone.
                self.emit(EventKind.UNFILLED)
                self.unfilled = True
                if self.unfilled_keys is not None:
                    self.unfilled_keys.note(self.keys.value, clock.monotonic(), acquired.lease_pttl)
                return (yield from self._alone())
            if acquired.won:
                self.emit(EventKind.LEASE_WON)
                landed = yield from self._judged(acquired.current)
                if landed is not None and landed.is_fresh(clock.time()):
                    # A rebuild landed between our read and our lease.
                    yield Release(token)
                    return landed.value, None
                # What is there (kept for errors alone) is served if the
                # rebuild raises, and not meanwhile: this caller missed.
                return (yield from self._rebuild_and_commit(token, landed, missed=True))
            self.emit(EventKind.LEASE_BUSY)
            if not self.can_wait:
                return (yield from self._no_wait())
            remaining = deadline - clock.monotonic()
            if remaining > 0:
                started = clock.monotonic()
                try:
                    waited: Waited = yield Wait(remaining, acquired.lease_pttl, unusable)
                except RedisUnavailableError as exc:
                    pause = yield from failover.pause(exc, pause)
                    continue
                self.emit(EventKind.WAIT, duration=clock.monotonic() - started)
                landed = yield from self._judged(waited.raw)
                if landed is not None and (fallback is None or landed.created_at > fallback.created_at):
                    return landed.value, None
                # Foreign bytes, or the value kept for errors changed in place
                # (invalidated, touched): wait for them to change, do not spin.
                unusable = waited.raw
                if clock.monotonic() < deadline:
                    if self.take_over or not waited.released:
                        continue  # freed without a value (or expired): try to take it
                    # The holder gave up without a value: each caller goes on
                    # alone rather than queue for the lease one at a time
                    # (a key that is normally absent must not serialise them).
                    return (yield from self._alone())
            try:
                value = yield from self.after_wait_timeout()
            except WaitTimeoutError as exc:
                return None, exc
            return value, None

    def _report(self, rebuilt: Rebuilt) -> None:
        if rebuilt.lease_lost:
            logger.warning("lost the lease on %r while rebuilding it", self.keys.name)
            self.emit(EventKind.LEASE_LOST)
        if rebuilt.error is None:
            self.emit(EventKind.REBUILD, duration=rebuilt.duration)
        elif isinstance(rebuilt.error, Exception):  # not a cancellation or interrupt
            self.emit(EventKind.REBUILD_ERROR, duration=rebuilt.duration, error=rebuilt.error)

    def _acquire(self, token: str) -> Generator[Op, Any, Acquired]:
        try:
            acquired: Acquired = yield Acquire(token, reads=not self.take_over)
        except GeneratorExit:  # closed unfinished: nothing more can be asked
            raise
        except BaseException:
            # The lease may have been granted although its reply never came
            # (a lost connection, a cancelled caller): drop it if it is ours
            # rather than leave it to block others until it expires. In the
            # background: the Redis that just failed must not stall us twice.
            yield Release(token, detached=True)
            raise
        if acquired.won:
            self.won_at = acquired.won_at
            self.failures = acquired.failures
        return acquired

    def _rebuild_and_commit(
        self, token: str, stale: Entry | None, *, missed: bool = False
    ) -> Generator[Op, Any, _Outcome]:
        try:
            # Before the rebuild reads its data: an invalidation of its tags
            # from now on leaves the value it stores stale.
            self.captured = yield Capture(self.tags)
        except GeneratorExit:  # closed unfinished: nothing more can be asked
            raise
        except BaseException:
            yield Release(token, detached=True)
            raise
        rebuilt: Rebuilt = yield Rebuild(token, None if missed else stale)
        # Stored while the lease's record is there, held or lapsed: a
        # rebuild that outlived its lease with nothing newer written
        # meanwhile is not thrown away.
        return (yield from self.settle(token, rebuilt, stale, self.won_at))

    def settle(
        self, token: str, rebuilt: Rebuilt, stale: Entry | None = None, won_at: str | None = None
    ) -> Generator[Op, Any, _Outcome]:
        """Store what the lease holder rebuilt (fenced), or free the lease if it failed.

        Returns ``(value, error)`` for the holder's caller; records in
        :attr:`committed` whether the value was stored. Also what a split
        lease (``Stampede.read`` then ``commit``) runs when it is committed.
        """
        name = self.keys.name
        self._report(rebuilt)
        if rebuilt.error is not None:
            # Recorded on the lease: nobody rebuilds it again for a while.
            failed = policy.failure(rebuilt.error, self.failures, random.random)
            yield Release(token, failed=failed)
            if failed is not None and self.failed_keys is not None:
                said = Acquired(
                    False, lease_pttl=failed.backoff_ms, failed=failed.error, failures=failed.failures
                )
                self.failed_keys.note(self.keys.value, self.clock.monotonic(), failed.backoff_ms, said)
            if policy.on_rebuild_error(name, rebuilt.error, stale=stale is not None):
                assert stale is not None
                return stale.value, None
            return None, rebuilt.error
        if isinstance(rebuilt.value, Unstored):
            yield Release(token)  # no failure: the next caller rebuilds at once
            return rebuilt.value.value, None
        try:
            data = self._encode(rebuilt)
        except SerializationError as exc:
            yield Release(token)
            return None, exc
        try:
            outcome = yield from policy.committed(
                Commit(token, data, if_lapsed=won_at is not None), self.options, self.clock
            )
        except RedisUnavailableError as exc:
            # Its waiters compete for the lease again; freed in the
            # background: the Redis that just failed must not stall us twice.
            yield Release(token, detached=True, retake=True)
            self.emit(EventKind.COMMIT_FAILED, error=exc)
            try:
                fallback = policy.on_store_failure(name, exc, stale=stale is not None, options=self.options)
            except RedisUnavailableError as error:
                return None, error
            if fallback is policy.Fallback.STALE:
                assert stale is not None
                return stale.value, None
            return rebuilt.value, None
        self.committed = outcome is True
        if not self.committed:
            self.superseded = True
            newer = (yield from self._judged(outcome.current)) if isinstance(outcome, Refused) else None
            return policy.on_refused_commit(name, rebuilt.value, newer, self.emit), None
        if self.take_over:
            # Its caller asked before any change the rebuild overlapped. Those
            # of this process who came since (a get_or_rebuild's followers;
            # a read's wait through Redis, judged on their own) may have come
            # after an invalidation of its tags by another process: if one is
            # seen now, they read again rather than share what it stored.
            stored = yield from self._judged(data)
            if stored is None or not stored.is_fresh(self.clock.time()):
                self.superseded = True
        return rebuilt.value, None

    def _encode(self, rebuilt: Rebuilt) -> bytes:
        return envelope_of(
            self.codec,
            self.keys,
            rebuilt.value,
            self.options,
            now=self.clock.time(),
            duration=rebuilt.duration,
            captured=self.captured,
        )
