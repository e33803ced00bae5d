"""``get_or_rebuild_many``: one read for the batch, one lease request, one
call of the caller's batch function and one commit; decided once for both
flavours and free of I/O.

Each key stays single-flight across processes, as with ``get_or_rebuild``:
the keys this caller wins leases for are rebuilt by one call of
``rebuild_many``; stale keys that others refresh are served stale; missing
keys that others rebuild are waited for, one after the other, each by the
machine of ``get_or_rebuild`` (each wait is bounded by ``wait_timeout``, and
they run concurrently elsewhere). What a caller is given when something
fails is decided in :mod:`~stampede._core.policy`, as for one key.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Generator, Mapping
from typing import Any, NamedTuple

from .._exceptions import ConfigurationError, RedisUnavailableError, SerializationError
from . import policy
from .calls import Calls
from .codec import envelope_of
from .envelope import Entry
from .events import EventKind
from .flow import new_token
from .keys import Keys
from .ops import (
    AcquireMany,
    AwaitFlight,
    Capture,
    Commit,
    CommitMany,
    FirstRead,
    Lookup,
    OfKey,
    Op,
    ReadMany,
    ReadTags,
    RebuildMany,
    Refused,
    ReleaseMany,
)
from .options import Options
from .relay import relayed
from .tags import TagsUnknown

__all__ = ["ABSENT", "Absent", "checked", "get_or_rebuild_many"]

Named = dict[bytes, tuple[Any, Keys]]
_Leases = tuple[tuple[Keys, str], ...]

#: What a key ``rebuild_many`` gave no value for gets: nothing stored, nothing returned.
ABSENT: Any = object()


class Absent(Exception):
    """``rebuild_many``, asked for one key alone, gave no value for it."""


class _Won(NamedTuple):
    key: Any
    keys: Keys
    stale: Entry | None
    token: str
    won_at: str | None
    #: How many rebuilds of the key in a row raised before, as its lease said.
    failures: int


def checked(mapping: Any) -> Mapping[Any, Any]:
    """What ``rebuild_many`` returned, if it is a mapping."""
    if not isinstance(mapping, Mapping):
        raise ConfigurationError(
            f"rebuild_many must return a mapping of the keys it was given to their values, "
            f"got {type(mapping).__name__}",
            field="rebuild_many",
        )
    return mapping


def get_or_rebuild_many(
    calls: Calls, named: Named, options: Options, tags: tuple[bytes, ...], *, can_wait: bool
) -> Generator[Op, Any, dict[Any, Any]]:
    """The batch ``named`` (caller's key by value name): ``{key: value}``.

    Callers of this process asking for the same batch share one: four
    hundred of them must not send four hundred ``MGET`` and lease requests
    (redis-py's pool holds a hundred connections and raises when empty). A
    caller that waited ``wait_timeout`` for it goes on with a batch of its own.
    """
    flights = calls.flights
    flight_key = ("batch", tuple(named), tags, options)
    while True:
        flight, leader = flights.join(flight_key)
        if leader:
            break
        joined = calls.settings.clock.monotonic()
        if not can_wait or not (yield AwaitFlight(flight.done, options.wait_timeout)):
            return (yield from _Batch(calls, named, options, tags, can_wait).run())
        # Joined once its leader had read: what it found may predate a write
        # that returned before this caller came. Those who did share the next.
        if not flight.abandoned and not flight.asked_before(joined):
            return dict(flight.outcome())
    try:
        found = yield from calls.leading(
            flight, _Batch(calls, named, options, tags, can_wait).run(), first=True
        )
    except BaseException as exc:
        flights.finish(flight_key, flight, error=exc)
        raise
    flights.finish(flight_key, flight, value=found)
    return dict(found)


class _Batch:
    """One batch, led by this caller."""

    def __init__(
        self, calls: Calls, named: Named, options: Options, tags: tuple[bytes, ...], can_wait: bool
    ) -> None:
        self.calls = calls
        self.settings = calls.settings
        self.judge = calls.settings.judge
        self.named = named
        self.options = options
        self.tags = tags
        self.can_wait = can_wait
        self.found: dict[Any, Any] = {}

    def run(self) -> Generator[Op, Any, dict[Any, Any]]:
        settings = self.settings
        options = self.options
        named = list(self.named.values())
        try:
            raws = yield ReadMany(tuple(names for _, names in named))
        except RedisUnavailableError as exc:
            policy.on_redis_failure(None, exc, stale=False, options=options, emit=self._emit_batch)
            yield from self._alone([key for key, _ in named])
            return self.found
        looked = [self.judge.lookup(names, raw, options) for (_, names), raw in zip(named, raws, strict=True)]
        # Tag states not read lately: all of them in one round trip, then
        # judged again; if Redis fails them, not served fresh: refreshed
        # (served stale if that fails too).
        ids = {tag: None for lookup in looked if isinstance(lookup, TagsUnknown) for tag in lookup.ids}
        readable = not ids or (yield ReadTags(tuple(ids)))
        todo: list[tuple[Any, Keys, Entry | None, Entry | None]] = []
        for (key, names), raw, lookup in zip(named, raws, looked, strict=True):
            if isinstance(lookup, TagsUnknown):
                lookup = (
                    self.judge.judged(names, raw, options)
                    if readable
                    else Lookup(self.judge.decode(names, raw))
                )
            if isinstance(lookup, Entry):
                self.found[key] = lookup.value
                continue
            if lookup.entry is None:
                settings.emit(names, EventKind.MISS)
            todo.append((key, names, lookup.entry, lookup.fallback))
        if todo:
            waits = yield from self._lease_and_rebuild(todo)
            for key, names in waits:
                # Another caller rebuilds it: waited for as get_or_rebuild
                # waits (and rebuilt alone, should that caller give up).
                value = yield from self._one(key, names)
                if value is not ABSENT:
                    self.found[key] = value
        return self.found

    def _states_read(self, raws: list[Any]) -> Generator[Op, Any, None]:
        """Before values read in the middle of the batch are judged: the tag
        states they record that were not read lately (or were found lost)
        are read (and made) first (see ``Flow._judged``)."""
        unknown = self.judge.tags_unknown(*(raw for raw in raws if raw is not None))
        if unknown:
            yield ReadTags(tuple(unknown))

    def _emit_batch(self, kind: EventKind, **details: Any) -> None:
        self.settings.emit_named("", kind, **details)

    def _alone(self, keys: list[Any]) -> Generator[Op, Any, None]:
        """``rebuild_many`` of ``keys`` without a lease, stored nowhere."""
        rebuilt = yield RebuildMany(tuple(keys), ())
        if rebuilt.error is not None:
            raise rebuilt.error
        self.found.update(checked(rebuilt.value))

    def _one(self, key: Any, names: Keys) -> Generator[Op, Any, Any]:
        """``get_or_rebuild`` of one key of the batch, the batch's function
        called for it alone should it come to a rebuild: its value, or
        :data:`ABSENT`."""
        steps = _of_key(names, key, self._one_key(names))
        try:
            return (yield from steps)
        except Absent:
            return ABSENT

    def _one_key(self, names: Keys) -> Generator[Op, Any, Any]:
        lookup = yield FirstRead()
        if isinstance(lookup, Entry):
            return lookup.value
        return (
            yield from self.calls.get_or_rebuild(
                names, self.options, lookup, self.tags, can_wait=self.can_wait
            )
        )

    def _lease_and_rebuild(
        self, todo: list[tuple[Any, Keys, Entry | None, Entry | None]]
    ) -> Generator[Op, Any, list[tuple[Any, Keys]]]:
        """Ask for the leases of ``todo`` (key, names, stale entry, entry kept
        for errors) at once; rebuild and commit those won, serve stale those
        others refresh. Returns the missing keys others rebuild, to wait for."""
        settings = self.settings
        found = self.found
        asked = tuple((names, new_token()) for _, names, _, _ in todo)
        try:
            replies = yield AcquireMany(asked)
        except GeneratorExit:  # closed unfinished: nothing more can be asked
            raise
        except BaseException as exc:
            # Some leases may have been granted although the replies never came
            # (a lost connection, a cancelled caller): freed in the background
            # (owner-checked), rather than left to block others until they expire.
            yield ReleaseMany(asked, detached=True)
            if not isinstance(exc, RedisUnavailableError):
                raise
            # Stale-if-error: the stale values, and those kept for errors alone.
            served = {key: entry or fallback for key, _, entry, fallback in todo}
            missing = [key for key, entry in served.items() if entry is None]
            policy.on_redis_failure(None, exc, stale=not missing, options=self.options, emit=self._emit_batch)
            found.update((key, entry.value) for key, entry in served.items() if entry is not None)
            if missing:
                yield from self._alone(missing)
            return []
        won: list[_Won] = []
        landed: list[tuple[Keys, str]] = []
        waits: list[tuple[Any, Keys]] = []
        yield from self._states_read([acquired.current for acquired in replies if acquired.won])
        for (key, names, entry, fallback), (_, token), acquired in zip(todo, asked, replies, strict=True):
            if not acquired.won:
                settings.emit(names, EventKind.LEASE_BUSY)
                if entry is not None:
                    settings.emit(names, EventKind.STALE_HIT)
                    found[key] = entry.value
                else:
                    waits.append((key, names))
                continue
            settings.emit(names, EventKind.LEASE_WON)
            current = self.judge.decode(names, acquired.current)
            if (
                current is not None
                and current.is_fresh(settings.clock.time())
                and (entry is None or current.created_at > entry.created_at)
            ):
                found[key] = current.value  # landed between the read and the lease
                landed.append((names, token))
                continue
            # What it is served should the rebuild fail: stale, or kept for errors.
            won.append(_Won(key, names, entry or fallback, token, acquired.won_at, acquired.failures))
        try:
            if landed:
                yield ReleaseMany(tuple(landed))
            if won:
                yield from self._rebuild(won)
        except GeneratorExit:  # closed unfinished: nothing more can be asked
            raise
        except BaseException:
            # Whatever was not committed is freed (a committed lease is gone already).
            yield ReleaseMany((*landed, *((one.keys, one.token) for one in won)), detached=True)
            raise
        return waits

    def _rebuild(self, won: list[_Won]) -> Generator[Op, Any, None]:
        settings = self.settings
        options = self.options
        found = self.found
        leases: _Leases = tuple((one.keys, one.token) for one in won)
        try:
            captured = yield Capture(self.tags)
        except GeneratorExit:  # closed unfinished: nothing more can be asked
            raise
        except BaseException:
            yield ReleaseMany(leases)
            raise
        rebuilt = yield RebuildMany(tuple(one.key for one in won), leases)
        error = rebuilt.error
        mapping: Mapping[Any, Any] = {}
        if error is None:
            try:
                mapping = checked(rebuilt.value)
            except ConfigurationError as exc:
                error = exc
        if error is not None:
            # A rebuild that raised is recorded on each lease, as for one key:
            # nobody rebuilds it again for a while. A result of the wrong shape
            # is the caller's mistake, not the data source's: nothing recorded.
            failed = (
                tuple(policy.failure(error, one.failures, random.random) for one in won)
                if rebuilt.error is not None
                else ()
            )
            yield ReleaseMany(leases, failed=failed)
            for one in won:
                settings.emit(one.keys, EventKind.REBUILD_ERROR, duration=rebuilt.duration, error=error)
            if not policy.on_rebuild_error(None, error, stale=all(one.stale is not None for one in won)):
                raise error
            found.update((one.key, one.stale.value) for one in won if one.stale is not None)
            return
        now = settings.clock.time()
        stored: list[tuple[_Won, Any]] = []
        commits: list[tuple[Keys, Commit]] = []
        absent: list[tuple[Keys, str]] = []
        for one in won:
            settings.emit(one.keys, EventKind.REBUILD, duration=rebuilt.duration)
            value = mapping.get(one.key, ABSENT)
            if value is ABSENT:
                absent.append((one.keys, one.token))
                if one.stale is not None:
                    found[one.key] = one.stale.value
                continue
            try:
                data = envelope_of(
                    settings.codec,
                    one.keys,
                    value,
                    options,
                    now=now,
                    duration=rebuilt.duration,
                    captured=captured,
                )
            except SerializationError:
                yield ReleaseMany(leases)
                raise
            stored.append((one, value))
            commits.append((one.keys, Commit(one.token, data, if_lapsed=True)))
        if absent:
            yield ReleaseMany(tuple(absent))
        try:
            replies = yield CommitMany(tuple(commits))
        except RedisUnavailableError as exc:
            yield ReleaseMany(leases, detached=True)
            for one, _ in stored:
                settings.emit(one.keys, EventKind.COMMIT_FAILED, error=exc)
            # Raises unless every key has a stale value or fail_open was
            # chosen; then each is served what Redis has, else what was rebuilt.
            policy.on_store_failure(
                None, exc, stale=all(one.stale is not None for one in won), options=options
            )
            for one, value in stored:
                found[one.key] = one.stale.value if one.stale is not None else value
            return
        yield from self._states_read([outcome.current for outcome in replies if isinstance(outcome, Refused)])
        for (one, value), outcome in zip(stored, replies, strict=True):
            if isinstance(outcome, Refused):
                newer = self.judge.decode(one.keys, outcome.current)
                emit = functools.partial(settings.emit, one.keys)
                found[one.key] = policy.on_refused_commit(one.keys.name, value, newer, emit)
            else:
                found[one.key] = value


def _of_key(keys: Keys, key: Any, steps: Generator[Op, Any, Any]) -> Generator[Op, Any, Any]:
    """``steps`` of one key's machine, each operation it asks for carried out
    on ``keys`` (see :class:`~stampede._core.ops.OfKey`)."""
    return relayed(steps, lambda op: OfKey(keys, key, op))
