"""A call past its first read, decided once for both flavours and free of I/O.

:class:`Calls` holds, for one instance, what the callers of this process
share (their flights, and what they found of other processes' leases) and
the machine of each call that missed: ``get_or_rebuild`` and ``read`` join
or lead this process's flight for the key; the leader runs the key's
:class:`~stampede._core.flow.Flow` across processes. Each machine is a
generator of :mod:`~stampede._core.ops`; the driver carries them out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Hashable
from math import inf
from typing import Any

from .._exceptions import ConfigurationError, RedisUnavailableError
from . import policy
from .envelope import Entry
from .events import EventKind, logger
from .flow import Flow
from .keys import Keys
from .lease import LEASE_TAKEN, Lease, Paused, Read
from .local_flights import LocalFlight, LocalFlights
from .memos import BusyLeases, FailedKeys, KeptAlone, UnfilledKeys
from .near import NearStore
from .ops import (
    AwaitFlight,
    Capture,
    FirstRead,
    InBackground,
    Keep,
    Lookup,
    Op,
    Rebuild,
    RebuildMany,
    Rebuilt,
    Release,
    RereadMany,
)
from .options import UNSET, Options
from .owed import Owed
from .relay import Stop, relayed
from .scope import LeaseScope
from .settings import Settings

__all__ = ["Calls", "until_rebuild"]

Steps = Generator[Op, Any, Any]


def until_rebuild(steps: Steps) -> Steps:
    """Carry ``steps`` out up to the rebuild it asks for, and stop there: a
    :class:`~stampede._core.lease.Paused` with its lease, for a caller that
    rebuilds by itself (``read``); or the value, if none was asked for."""
    return relayed(steps, lambda op: Stop(Paused(op.token, op.stale)) if isinstance(op, Rebuild) else op)


#: What ``Calls._lease_for`` answers when another caller of this process holds
#: the lease of the process alone (Redis failing, under fail_open).
_HELD_ALONE = Read(False)


class Calls:
    """The machines of one instance's calls, and what its callers in this
    process share: their flights by key (``new_event`` makes the flavour's
    event), the keys another process was found refreshing, the keys found
    marked as ones that reads do not fill. ``fails_over``: the primary can be
    replaced (a Redis Cluster, a Sentinel-managed master)."""

    def __init__(
        self,
        settings: Settings,
        new_event: Callable[[], Any],
        *,
        fails_over: bool,
        near: NearStore | None = None,
    ) -> None:
        self.settings = settings
        self.fails_over = fails_over
        self._new_event = new_event
        self._near = near
        self.flights: LocalFlights[Any] = LocalFlights(new_event)
        #: Keys another process was found refreshing: not asked again for a moment.
        self.busy = BusyLeases()
        #: Keys found marked as ones that reads do not fill.
        self.unfilled = UnfilledKeys()
        #: Keys whose last rebuild raised, found so moments ago.
        self.failed = FailedKeys()
        #: Values rebuilt or written while Redis was away (fail_open).
        self.kept = KeptAlone(near)

    def forked(self) -> None:
        """In a child process just forked: the flights other threads had under
        way did not come along."""
        self.flights = LocalFlights(self._new_event)

    def written(self, *written: Keys) -> None:
        """This process wrote ``written`` (a value, a delete, a commit...):
        what it remembered of them is forgotten, its near copies dropped, and
        the flights of those keys under way no longer share their outcome
        with callers that join them (see ``LocalFlight.overtaken``)."""
        near = self._near
        for keys in written:
            value = keys.value
            self.busy.forget(value)
            self.unfilled.forget(value)
            self.failed.forget(value)
            if near is not None:
                near.invalidate([value])  # this process sees its own write at once
            self.flights.overtake(value, (value, "read"), (value, "after-wait"))

    def unsent_write(self, keys: Keys, value: Any, ttl: float | None) -> None:
        """Redis failed a write of ``value`` under fail_open: served to this
        process's callers while Redis is away, for ``ttl`` (see :class:`KeptAlone`)."""
        self.kept.keep(keys.value, value, self.settings.clock.monotonic(), ttl)

    def unsent_removals(self, owed: tuple[Owed, ...]) -> None:
        """Redis failed removals under fail_open (they are owed): this
        process sees them at once, in what it kept and in its near copies (a
        removal by tag, prefix or ``clear``: all of them)."""
        names = [removal.keys.value for removal in owed if removal.keys is not None]
        every = len(names) < len(owed)
        if every:
            self.kept.clear()
        for name in names:
            self.kept.forget(name)
        if self._near is not None:
            self._near.invalidate(None if every else names)

    def flow(self, keys: Keys, options: Options, **kwargs: Any) -> Flow:
        """A :class:`Flow` for one call; ``kwargs``: the flow's keyword options."""
        settings = self.settings
        return Flow(
            keys,
            options,
            settings.codec,
            functools.partial(settings.judge.decode, keys),
            settings.clock,
            functools.partial(settings.emit, keys),
            fails_over=self.fails_over,
            busy=self.busy,
            unfilled_keys=self.unfilled,
            failed_keys=self.failed,
            kept=self.kept,
            unknown=settings.judge.tags_unknown,
            **kwargs,
        )

    # --- get_or_rebuild -------------------------------------------------------

    def get_or_rebuild(
        self, keys: Keys, options: Options, lookup: Lookup, tags: tuple[bytes, ...], *, can_wait: bool
    ) -> Steps:
        """A ``get_or_rebuild`` whose first read found ``lookup``: lead this
        process's flight for the key, or follow it (served the stale value in
        hand at once, else woken by the leader's outcome within
        ``wait_timeout``). ``can_wait``: not on an event loop's thread."""
        missed = False  # whether this call was reported as a miss
        while True:
            flight, leader = self.flights.join(keys.value)
            if leader:
                break
            late = flight.overtaken  # joined after a write of this process: read again after it
            if lookup.entry is not None:
                return self._serve_follower(keys, lookup.entry)
            if not can_wait:
                return (yield from self.flow(keys, options).without_waiting())
            missed = self._miss_once(keys, missed)
            started = self.settings.clock.monotonic()
            if not (yield AwaitFlight(flight.done, options.wait_timeout)):
                return (yield from self._after_wait_timeout(keys, options))
            self._waited(keys, started)
            if flight.superseded or late or flight.asked_before(started):
                again = yield FirstRead()  # what the newer write left
                if isinstance(again, Entry):
                    return again.value
                lookup = again
            elif not flight.abandoned:
                return flight.outcome()
        if options.background and lookup.entry is not None:
            flow = self.flow(keys, options, background=True, tags=tags)
            refresh = self._led(keys.value, flight, flow, flow.run(lookup), background=True)
            try:
                yield InBackground(refresh, f"stampede-refresh {keys.name}")
            except RuntimeError as exc:  # shutting down
                logger.info("cannot refresh %r in the background: %s", keys.name, exc)
                self.flights.finish(keys.value, flight, error=exc)
            return self._serve_follower(keys, lookup.entry)
        flow = self.flow(keys, options, can_wait=can_wait, missed=missed, tags=tags)
        return (yield from self._led(keys.value, flight, flow, flow.run(lookup)))

    def leading(self, flight: LocalFlight[Any], steps: Steps, *, first: bool = False) -> Steps:
        """``steps`` of ``flight``'s leader, the flight told when its leader
        asks Redis (see ``LocalFlight.asked_at``): each time, or (``first``)
        the first time only, for a leader whose later questions concern part
        of what it shares (a batch: its commits, its waits for some keys). A
        rebuild is no question to Redis: callers who join while it runs
        share it if a question follows (its commit); one without a lease,
        after which none does, is shared by all who join."""
        monotonic = self.settings.clock.monotonic

        def asked(op: Op) -> Op:
            if isinstance(op, (Rebuild, RebuildMany)):
                if not (op.token if isinstance(op, Rebuild) else op.leases):
                    # Rebuilt without a lease (Redis away, or full): nothing
                    # will vouch for it and nothing better is to be had, so
                    # whoever joins while it runs shares it (single flight
                    # without Redis).
                    flight.asked_at = inf
            elif not (first and flight.asked_at > -inf):
                flight.asked_at = monotonic()
            return op

        return relayed(steps, asked)

    def _after_wait_timeout(self, keys: Keys, options: Options) -> Steps:
        # Callers that gave up on this process's own flight share one
        # fallback, so a slow rebuild is not joined by one more per caller.
        fallback_key = (keys.value, "after-wait")
        while True:
            flight, leader = self.flights.join(fallback_key)
            if leader:
                break
            yield AwaitFlight(flight.done, None)  # bounded as a rebuild of its own would be
            if not flight.abandoned:
                return flight.outcome()
        flow = self.flow(keys, options)
        return (yield from self._led(fallback_key, flight, flow, flow.after_wait_timeout()))

    def _led(
        self,
        flight_key: Hashable,
        flight: LocalFlight[Any],
        flow: Flow,
        steps: Steps,
        *,
        background: bool = False,
    ) -> Steps:
        """``steps`` of the flight's leader, whose outcome its followers share."""
        try:
            value = yield from self.leading(flight, steps)
        except BaseException as exc:
            self.flights.finish(flight_key, flight, error=exc)
            if background and isinstance(exc, Exception):
                # Its caller was served already: nobody is left to receive it.
                logger.warning("background refresh of %r failed", flow.keys.name, exc_info=exc)
                return None
            raise
        self.flights.finish(flight_key, flight, value=value, superseded=flow.superseded)
        return value

    # --- read, commit, release: a lease handed to the caller ------------------

    def reread_in_scope(self, scope: LeaseScope, key: Any, owner: Any) -> Generator[Op, Any, Read | None]:
        """A ``read`` of ``key`` in ``scope``, which holds its lease already:
        a miss at once (``Read``) for another caller of the same unit of work,
        which never waits for itself; the lease given back (``None``: read on)
        if the same caller (``owner``) read it and did not write it since."""
        namespace = self.settings.keys.namespace
        reader = scope._reader(namespace, key)
        if reader is None:
            return None
        if reader != owner:
            return Read(False)
        # Read twice by the same caller, and not written in between: this
        # unit of work does not fill the key; nobody need wait.
        again = scope._take(namespace, key)
        assert again is not None
        yield from self.give_back(again, unfilled=not scope.failed)
        return None

    def read(
        self,
        keys: Keys,
        key: Any,
        options: Options,
        lookup: Lookup,
        tags: tuple[bytes, ...],
        *,
        can_wait: bool,
        scope: LeaseScope | None,
        owner: Any,
    ) -> Generator[Op, Any, Read]:
        """A ``read`` whose first read found ``lookup``: the stale value, or a
        miss with the lease for this caller to rebuild under, or what another
        caller of this process (who took the lease) or process stored within
        ``wait_timeout``. A lease won is held by ``scope`` for ``owner``."""
        if lookup.entry is None and lookup.error is None:
            unfilled = self._known_unfilled(keys)
            if unfilled is not None:
                return unfilled
        clock = self.settings.clock
        flight_key = (keys.value, "read")
        deadline = clock.monotonic() + options.wait_timeout
        missed = False  # whether this call was reported as a miss
        while True:
            if lookup.entry is None and can_wait:
                # Checked again after each flight waited for: the one that
                # came first may have taken the lease of the process alone.
                alone = yield from self._rebuilt_alone(keys, deadline)
                if alone is not None:
                    return alone
            flight, leader = self.flights.join(flight_key)
            if leader:
                break
            late = flight.overtaken  # joined after a write of this process: its outcome may be older
            if lookup.entry is not None:
                return Read(True, self._serve_follower(keys, lookup.entry))
            if not can_wait:
                self.settings.emit(keys, EventKind.NO_WAIT)
                return Read(False)
            missed = self._miss_once(keys, missed)
            started = clock.monotonic()
            remaining = deadline - started
            if remaining <= 0 or not (yield AwaitFlight(flight.done, remaining)):
                policy.on_wait_timeout(keys.name, options, functools.partial(self.settings.emit, keys))
                return Read(False)
            self._waited(keys, started)
            if flight.abandoned or late or flight.asked_before(started):
                continue
            shared = flight.outcome()
            if shared is not LEASE_TAKEN:
                return shared  # type: ignore[no-any-return]
            # A caller of this process rebuilds under the lease: the next
            # flight waits for its commit.
        try:
            flow = self.flow(
                keys,
                options,
                take_over=False,
                can_wait=can_wait,
                deadline=deadline,
                missed=missed,
                tags=tags,
            )
            outcome = yield from until_rebuild(self.leading(flight, flow.run(lookup)))
            read = self._lease_for(keys, options, flow, outcome) if isinstance(outcome, Paused) else None
        except BaseException as exc:
            self.flights.finish(flight_key, flight, error=exc)
            raise
        if read is _HELD_ALONE:
            # Redis failed, and another caller of this process took the lease
            # of the process alone meanwhile: this one (and those who waited
            # on it) waits for its write, as a caller that came later does.
            self.flights.finish(flight_key, flight, value=LEASE_TAKEN)
            alone = (yield from self._rebuilt_alone(keys, deadline)) if can_wait else None
            return alone if alone is not None else Read(False, unfilled=flow.unfilled)
        if read is None:
            read = Read(True, outcome)
        self.flights.finish(flight_key, flight, value=LEASE_TAKEN if read.lease is not None else read)
        if scope is not None and read.lease is not None:
            scope._hold(self.settings.keys.namespace, key, read.lease, owner)
            if scope.renew and read.lease._alone is None:
                yield Keep(read.lease)
        return read

    def _rebuilt_alone(self, keys: Keys, deadline: float) -> Generator[Op, Any, Read | None]:
        """A caller of this process rebuilds ``keys`` without Redis (it failed,
        under fail_open: see :meth:`_lease_for`): what it stores, waited for
        until ``deadline``; ``None`` if there is none, or it stores nothing."""
        alone_key = (keys.value, "alone")
        held = self.flights.follow(alone_key)
        if held is None:
            return None
        now = self.settings.clock.monotonic()
        if held.until <= now:  # its holder never settled it: nobody waits for it any more
            self.flights.finish(alone_key, held, value=Read(False))
            return None
        remaining = min(deadline, held.until) - now
        if remaining <= 0 or not (yield AwaitFlight(held.done, remaining)):
            return None
        shared: Read = held.outcome()
        return shared if shared.found else None

    def _lease_for(self, keys: Keys, options: Options, flow: Flow, paused: Paused) -> Read:
        if paused.token is None:  # no lease to hand out (unfilled, fail-open, or gave up waiting)
            if flow.failed_open and paused.stale is None:
                # Redis failed: this caller rebuilds for the callers of its
                # process that come meanwhile, who wait for its write (one
                # rebuild per key per process, as get_or_rebuild's).
                held, leads = self.flights.join((keys.value, "alone"))
                if not leads:
                    return _HELD_ALONE
                now = self.settings.clock.monotonic()
                held.until = now + options.lease_ttl
                lease = Lease(keys, "", flow, options, now, None, on_miss=True)
                lease._alone = held
                return Read(False, None, lease, None)
            return Read(False, unfilled=flow.unfilled)
        lease = Lease(
            keys,
            paused.token,
            flow,
            options,
            self.settings.clock.monotonic(),
            flow.won_at,
            on_miss=paused.stale is None,
        )
        return Read(False, None, lease, paused.stale)

    def settle_options(self, lease: Lease, ttl: Any, stale_ttl: Any) -> Options:
        """The lease's options, with the committer's ``ttl``/``stale_ttl`` if given."""
        given = {
            name: value for name, value in (("ttl", ttl), ("stale_ttl", stale_ttl)) if value is not UNSET
        }
        options = lease._options.merged(given) if given else lease._options
        lease._flow.options = options
        return options

    def rebuilt_by_holder(self, lease: Lease, value: Any) -> Rebuilt:
        """What the holder of ``lease`` (checked) rebuilt: ``value``."""
        if not isinstance(lease, Lease):
            raise ConfigurationError(
                f"lease must be a stampede.Lease from read(), got {lease!r}", field="lease"
            )
        return Rebuilt(value, None, self.settings.clock.monotonic() - lease._started)

    def commit(
        self, lease: Lease, rebuilt: Rebuilt, tags: tuple[bytes, ...] | None, *, store_if_lapsed: bool
    ) -> Generator[Op, Any, bool]:
        """Store what the holder of ``lease`` rebuilt (see ``Flow.settle``);
        ``tags``: those it carries, if not known at the ``read``. Returns
        whether it was stored."""
        flow = lease._flow
        if tags is not None and tags != flow.tags:
            try:
                # What the tags were when the lease was won: one invalidated
                # since leaves the value stored stale.
                captured = yield Capture(tags, lease._won_at)
            except GeneratorExit:  # closed unfinished: nothing more can be asked
                raise
            except BaseException:
                # Nothing stored: the lease is freed for another caller.
                yield Release(lease.token, detached=True)
                raise
            flow.tags, flow.captured = tags, captured
        won_at = lease._won_at if store_if_lapsed else None
        _, error = yield from flow.settle(lease.token, rebuilt, None, won_at)
        if error is not None:
            raise error
        return flow.committed

    def give_back(self, lease: Lease, *, unfilled: bool) -> Generator[Op, Any, None]:
        """Free ``lease`` without a value; ``unfilled``: its holder's unit of
        work did not fill the key (marked so, if its reader found it missing)."""
        lease._stop_renewing()
        if lease._alone is not None:
            self.settle_alone(lease, None)
            return
        yield Release(lease.token, unfilled=unfilled and lease._on_miss)

    def settle_alone(self, lease: Lease, value: Any, ttl: float | None = None) -> None:
        """The holder of ``lease``, rebuilt without Redis (see :meth:`_lease_for`),
        committed ``value`` (``None``: gave it back): the callers of its
        process waiting for it are served it (or go on by themselves), and
        the next ones for ``ttl`` while Redis is away, where the policy keeps
        such values. It is stored nowhere: with no lease record to refuse it,
        a write of the key made meanwhile (a delete) would be undone."""
        held, lease._alone = lease._alone, None
        if value is not None and lease._flow.keeps_alone:
            self.kept.keep(lease.keys.value, value, self.settings.clock.monotonic(), ttl)
        if held is not None:
            found = Read(True, value) if value is not None else Read(False)
            self.flights.finish((lease.keys.value, "alone"), held, value=found)

    # --- reads without a lease ------------------------------------------------

    def plain_failed(
        self,
        names: list[Keys],
        error: RedisUnavailableError,
        replicas: list[tuple[bool, Any]],
        *,
        one: bool = False,
    ) -> Generator[Op, Any, list[Any]]:
        """A plain read of ``names`` (``get``, ``get_many``) failed on the
        primary, and ``replicas`` is what the replicas answered, per key
        (whether one did, and what it holds): serve that if any answered;
        else, where the primary can fail over, read again until the primary
        (or a replica) answers, within ``wait_timeout``; else raise ``error``.
        ``one``: a ``get``, for which a replica holding nothing is no answer
        (the primary may hold a value): ``error`` is raised."""
        settings = self.settings
        if any(answered for answered, _ in replicas):
            if one and replicas[0][1] is None:
                raise error
        else:
            clock = settings.clock
            deadline = clock.monotonic() + settings.options.wait_timeout
            failover = policy.Failover(self.fails_over, settings.options, clock, deadline)
            primary, replicas = yield from failover.until_primary(RereadMany(tuple(names)), error)
            if primary:
                return [raw for _, raw in replicas]
        for keys, (_, raw) in zip(names, replicas, strict=True):
            if raw is not None:
                settings.emit(keys, EventKind.REPLICA_HIT)
        return [raw for _, raw in replicas]

    # --- what a caller is told ---------------------------------------------

    def _serve_follower(self, keys: Keys, entry: Entry) -> Any:
        """A caller whose process already has a refresh of ``keys`` under way."""
        fresh = entry.is_fresh(self.settings.clock.time())
        self.settings.emit(keys, EventKind.HIT if fresh else EventKind.STALE_HIT)
        return entry.value

    def _miss_once(self, keys: Keys, missed: bool) -> bool:
        """A caller about to wait for a rebuild its process already has under
        way: a miss, reported once per call (its flow, should it lead later,
        does not report it again). Returns ``True``: reported."""
        if not missed:
            self.settings.emit(keys, EventKind.MISS)
        return True

    def _waited(self, keys: Keys, started: float) -> None:
        """A caller's wait for its process's own flight ended (monotonic ``started``)."""
        settings = self.settings
        if settings.on_event is not None:
            settings.emit(keys, EventKind.WAIT, duration=settings.clock.monotonic() - started)

    def _known_unfilled(self, keys: Keys) -> Read | None:
        """A ``read`` of ``keys``, found missing: a miss at once if this process
        found it marked as a key that reads do not fill moments ago (see
        :class:`~stampede._core.memos.UnfilledKeys`), else ``None``."""
        if not self.unfilled.known(keys.value, self.settings.clock.monotonic()):
            return None
        self.settings.emit(keys, EventKind.MISS)
        self.settings.emit(keys, EventKind.UNFILLED)
        return Read(False, unfilled=True)
