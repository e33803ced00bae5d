"""A Redis that evicts, read and written by several instances, and checked against a database whose
versions say what each read may serve (``python -m bench eviction``, ``tests/test_eviction.py``).

The database holds a version per key, per tag and for the namespace. A rebuild reads the three
versions of its key as it starts and returns them as its value. A writer raises a version and then
tells the cache: ``set`` (a value of the new version), ``delete``, ``invalidate``,
``invalidate_tags``, ``delete_tags`` or ``invalidate_all``. Once that call has returned, a read
begun afterwards must not serve as fresh a value older than that version, and must not serve at
all a value older than what ``delete`` or ``delete_tags`` removed. Meanwhile a filler writes keys
of its own, with expiries (``volatile-*`` policies evict only those), so that Redis evicts
whatever its policy picks: values, leases, fences, tag states, the namespace's state.

Reads are ``get`` (whose entry says whether it is fresh), ``get_or_rebuild`` and
``get_or_rebuild_many`` (which may serve a stale value, never a deleted one), and ``read`` (a
request's lease: a value found is checked as ``get_or_rebuild``'s; a lease won is committed with a
value rebuilt, half of them with ``store_if_lapsed``), from blocking instances' threads and an
asyncio instance's tasks. Rebuilds are timed per key: how many of one key ran at once, and how
many began within one ``ttl``.
"""

from __future__ import annotations

import asyncio
import bisect
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio

import stampede
import stampede.asyncio
from stampede.testing import RedisServer

__all__ = ["POLICIES", "Evicting", "Outcome", "Scenario", "kind_of", "run", "served"]

#: Every ``maxmemory-policy`` Redis has.
POLICIES = (
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
    "noeviction",
)
NAMESPACE = "evicting"
#: What a writer does, and how often (weights).
#: What a reader does, and how often (weights): ``get`` (an entry, fresh or not), ``get_or_rebuild``,
#: ``get_or_rebuild_many`` of keys of one tag, and ``read`` then ``commit`` (a request's lease).
READS = {"get": 3, "rebuild": 4, "batch": 1.5, "request": 1.5}
#: Keys per batch.
BATCH = 3
WRITES = {
    "set": 4,
    "delete": 4,
    "invalidate": 4,
    "invalidate_tags": 3,
    "delete_tags": 3,
    "invalidate_all": 1,
}


@dataclass(frozen=True)
class Scenario:
    """The load: ``instances`` blocking instances (as many processes would be) of ``readers``
    threads, an asyncio instance of ``async_readers`` tasks, and ``writers`` threads writing
    (none: reads only, for counting rebuilds)."""

    seconds: float = 4.0
    keys: int = 40
    tags: int = 6
    instances: int = 3
    readers: int = 4
    #: Tasks on one asyncio instance more (0: none).
    async_readers: int = 8
    writers: int = 2
    #: Seconds between two writes of one writer.
    write_every: float = 0.01
    ttl: float = 1.0
    stale_ttl: float = 2.0
    lease_ttl: float = 1.0
    rebuild_seconds: float = 0.02
    value_bytes: int = 3000
    maxmemory: str = "3mb"
    #: Bytes per filler key, and filler keys written per second.
    filler_bytes: int = 6000
    filler_rate: float = 800.0
    #: Whether the last instance keeps near copies (their coherence has bounds of its own: see
    #: the near cache's docs).
    near: bool = False
    #: How late one instance sees another's tag and namespace invalidations, at most (0: at
    #: once, every read asks Redis; the reads are checked with that lag).
    tag_check_interval: float = 0.0


@dataclass
class Outcome:
    """What one run saw."""

    policy: str
    reads: int = 0
    fresh_reads: int = 0
    writes: Counter[str] = field(default_factory=Counter)
    #: Reads that served as fresh a value older than a removal, a replacement or a tag's or the
    #: namespace's invalidation that had returned before the read began, by cause.
    fresh_too_old: Counter[str] = field(default_factory=Counter)
    #: Reads that served at all a value removed by a delete or delete_tags returned before.
    deleted_served: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    #: Reads handed, by a rebuild in flight when they came, a value older than a deletion made
    #: meanwhile (single flight's way: not counted among the above).
    handed_over: int = 0
    rebuilds: int = 0
    most_at_once: int = 0
    most_in_a_window: int = 0
    #: The most rebuilds of one key begun within one ``ttl`` with nothing its value needs evicted
    #: between them (its value, its tag's or the namespace's state).
    most_in_a_kept_window: int = 0
    evicted: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return sum(self.fresh_too_old.values()) + sum(self.deleted_served.values())

    def describe(self) -> str:
        return (
            f"{self.policy}: {self.reads} reads ({self.fresh_reads} fresh by get), "
            f"writes {dict(self.writes)}; "
            f"fresh but too old {dict(self.fresh_too_old)}, deleted yet served {dict(self.deleted_served)}, "
            f"errors {dict(self.errors)}; {self.handed_over} handed over by a rebuild in flight; "
            f"{self.rebuilds} rebuilds, at most {self.most_at_once} of a key "
            f"at once, {self.most_in_a_window} within one ttl ({self.most_in_a_kept_window} with nothing "
            f"evicted between them); evicted {dict(self.evicted)}"
            + (f"; e.g. {self.examples[:3]}" if self.examples else "")
        )


class _Database:
    """Versions: of each key, each tag and the namespace; raised by writers, read by rebuilds."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: Counter[str] = Counter()
        self.tags: Counter[str] = Counter()
        self.namespace = 0

    def read(self, key: str, tag: str) -> tuple[int, int, int]:
        with self.lock:
            return self.keys[key], self.tags[tag], self.namespace


class _Rules:
    """What a read begun now may serve: for each key, tag and the namespace, the oldest version
    that may be served as fresh, and the oldest that may be served at all, each with when the
    call that raised it began. Raised once that call has returned; for a tag or the namespace,
    ``lag`` seconds later (``tag_check_interval``: how late another process sees it)."""

    def __init__(self, lag: float) -> None:
        self.lag = lag
        self.lock = threading.Lock()
        # By name: (from when, version, began), versions rising.
        self.fresh: dict[str, list[tuple[float, int, float]]] = defaultdict(list)
        self.served: dict[str, list[tuple[float, int, float]]] = defaultdict(list)

    def require(self, name: str, version: int, began: float, *, deleted: bool) -> None:
        at = time.monotonic() + (0.0 if name.startswith("k:") else self.lag)
        with self.lock:
            for book in (self.fresh, self.served) if deleted else (self.fresh,):
                book[name].append((at, version, began))

    @staticmethod
    def _least(book: list[tuple[float, int, float]], now: float) -> tuple[int, float]:
        best = (0, 0.0)
        for at, version, began in book:
            if at <= now and version > best[0]:
                best = (version, began)
        return best

    def now(self, key: str, tag: str) -> _Required:
        now = time.monotonic()
        names = ("k:" + key, "t:" + tag, "ns")
        with self.lock:
            fresh = tuple(self._least(self.fresh[name], now) for name in names)
            served = tuple(self._least(self.served[name], now) for name in names)
        return fresh, served


_Required = tuple[tuple[tuple[int, float], ...], tuple[tuple[int, float], ...]]
_CAUSES = ("key", "tag", "namespace")


class _Rebuilds:
    """Each rebuild's start and end, per key; the most of one key running at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: dict[str, list[float]] = defaultdict(list)
        self.running: Counter[str] = Counter()
        self.most_at_once = 0

    @contextmanager
    def one(self, key: str) -> Iterator[None]:
        with self.lock:
            self.starts[key].append(time.monotonic())
            self.running[key] += 1
            self.most_at_once = max(self.most_at_once, self.running[key])
        try:
            yield
        finally:
            with self.lock:
                self.running[key] -= 1

    def most_within(self, seconds: float, losses: dict[str, list[float]] | None = None) -> int:
        """The most rebuilds of one key begun within ``seconds`` of each other; with ``losses``
        (by key, the times something its value needs was evicted: the value, its tag's or the
        namespace's state), only those with no such loss between them."""
        most = 0
        for key, starts in self.starts.items():
            lost = sorted(losses.get(key, ())) if losses is not None else []
            epochs = [bisect.bisect_right(lost, at) for at in starts]
            first = 0
            for last, at in enumerate(starts):
                while at - starts[first] >= seconds or epochs[first] != epochs[last]:
                    first += 1
                most = max(most, last - first + 1)
        return most


class _Inline:
    """A blocking instance's methods as coroutines that run them there and
    then, never suspending: the one reader loop drives both flavours, run by
    :func:`_inline` with no event loop on the thread (a blocking call made on
    a loop's thread would not wait for another's rebuild)."""

    def __init__(self, sf: stampede.Stampede) -> None:
        self._sf = sf

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._sf, name)

        async def inline(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        return inline

    async def computed(self, function: Callable[[], Any]) -> Any:
        return function()


class _OnLoop:
    """An asyncio instance, with :meth:`computed` off the loop."""

    def __init__(self, sf: stampede.asyncio.Stampede) -> None:
        self._sf = sf

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sf, name)

    async def computed(self, function: Callable[[], Any]) -> Any:
        return await asyncio.to_thread(function)


def _inline(steps: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine whose awaits all complete at once (see :class:`_Inline`)."""
    try:
        steps.send(None)
    except StopIteration:
        return
    steps.close()
    raise RuntimeError("a reader on a blocking instance suspended")


def kind_of(name: bytes, namespace: str = NAMESPACE) -> str:
    """What a key of Redis is to ``namespace``: a value, a lease, a tag's or the namespace's
    state, or someone else's key (``filler``)."""
    if not name.startswith(namespace.encode()):
        return "filler"
    if name.endswith(b":lease"):
        return "lease"
    if name.endswith(b"{}:tag"):
        return "namespace state"
    if name.endswith(b"}:tag"):
        return "tag state"
    return "value"


class Evicting:
    """One run under one policy, on ``server`` (started with the policy)."""

    def __init__(self, scenario: Scenario, policy: str, url: str) -> None:
        self.scenario = scenario
        self.url = url
        self.outcome = Outcome(policy)
        self.database = _Database()
        self.rules = _Rules(scenario.tag_check_interval)
        self.rebuilds = _Rebuilds()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        # One write at a time: a set reads its versions before it is called, as an application
        # does, and an invalidation of its tag between the two would be the application's race.
        self.writing = threading.Lock()
        self.instances: list[stampede.Stampede] = []
        #: Every eviction: when it was told, of what kind, of which key.
        self.losses: list[tuple[float, str, bytes]] = []

    def tag_of(self, key: str) -> str:
        return f"g{int(key[1:]) % self.scenario.tags}"

    def rebuild(self, key: str) -> Callable[[], tuple[Any, ...]]:
        def rebuild() -> tuple[Any, ...]:
            with self.rebuilds.one(key):
                # When its data was read: what a removal begun later may have missed.
                versions, made = self.database.read(key, self.tag_of(key)), time.monotonic()
                time.sleep(self.scenario.rebuild_seconds)
                return (key, *versions, made, b"v" * self.scenario.value_bytes)

        return rebuild

    def check(
        self, key: str, value: Any, rules: _Required, *, fresh: bool, cached: bool, by: str = "get_or_rebuild"
    ) -> None:
        """A read of ``key`` served ``value`` (as fresh or not), begun when ``rules`` held;
        ``cached``: read from the cache alone (``get``), not maybe handed over by a rebuild in
        flight (single flight hands its callers the result of a rebuild begun before they came)."""
        if not (isinstance(value, tuple) and len(value) == 6 and value[0] == key):
            with self.lock:
                self.outcome.errors["foreign value"] += 1
            return
        versions, made = value[1:4], value[4]
        must_fresh, must_served = rules
        with self.lock:
            for cause, got, (least_fresh, _), (least, began) in zip(
                _CAUSES, versions, must_fresh, must_served, strict=True
            ):
                if got < least:
                    if cached or made < began:
                        self.outcome.deleted_served[cause] += 1
                        self.outcome.examples.append(
                            f"{key}: {cause} version {got} served after {least} deleted ({by})"
                        )
                    else:
                        self.outcome.handed_over += 1
                elif fresh and got < least_fresh:
                    self.outcome.fresh_too_old[cause] += 1
                    self.outcome.examples.append(
                        f"{key}: {cause} version {got} fresh after {least_fresh} invalidated ({by})"
                    )

    def plan(self, rng: random.Random) -> tuple[str, list[str], str]:
        """What a reader does next (one of :data:`READS`), to which keys, all of one tag."""
        (kind,) = rng.choices(list(READS), list(READS.values()))
        s = self.scenario
        key = rng.randrange(s.keys)
        keys = [f"k{key}"]
        if kind == "batch":
            # Keys of one tag (a batch carries one set of tags).
            same_tag = range(key % s.tags, s.keys, s.tags)
            keys = [f"k{n}" for n in rng.sample(same_tag, min(BATCH, len(same_tag)))]
        return kind, keys, self.tag_of(keys[0])

    def served(
        self, key: str, value: Any, rules: _Required, by: str, *, fresh: bool = False, cached: bool = False
    ) -> None:
        """:meth:`check` (``by``: the kind of read), and the read counted."""
        self.check(key, value, rules, fresh=fresh, cached=cached, by=by)
        with self.lock:
            self.outcome.reads += 1
            self.outcome.fresh_reads += fresh

    def failed(self, exc: Exception) -> None:
        with self.lock:
            self.outcome.errors[type(exc).__name__] += 1

    def rebuild_many(self, keys: list[str]) -> dict[str, tuple[Any, ...]]:
        return {key: self.rebuild(key)() for key in keys}

    async def reader(self, sf: Any, seed: int) -> None:
        """One reader's loop: on an asyncio instance (:class:`_OnLoop`), or on
        a blocking one (:class:`_Inline`, each call blocking its thread)."""
        rng = random.Random(seed)
        while not self.stop.is_set():
            kind, keys, tag = self.plan(rng)
            rules = {key: self.rules.now(key, tag) for key in keys}
            key = keys[0]
            try:
                if kind == "get":
                    entry = await sf.get(key)
                    if entry is not None:
                        self.served(key, entry.value, rules[key], kind, fresh=entry.is_fresh(), cached=True)
                elif kind == "rebuild":
                    self.served(
                        key, await sf.get_or_rebuild(key, self.rebuild(key), tags=[tag]), rules[key], kind
                    )
                elif kind == "batch":
                    values = await sf.get_or_rebuild_many(keys, self.rebuild_many, tags=[tag])
                    for name, value in values.items():
                        self.served(name, value, rules[name], kind)
                else:
                    read = await sf.read(key, tags=[tag])
                    if read.found:
                        self.served(key, read.value, rules[key], kind)
                    elif read.lease is not None:
                        value = await sf.computed(self.rebuild(key))
                        await sf.commit(read.lease, value, store_if_lapsed=rng.random() < 0.5)
            except stampede.StampedeError as exc:
                self.failed(exc)

    async def async_instance(self) -> None:
        """An asyncio instance (another process's, as it were) of ``async_readers`` tasks."""
        s = self.scenario
        client = redis.asyncio.Redis.from_url(self.url, socket_timeout=5)
        try:
            async with stampede.asyncio.Stampede(
                client,
                namespace=NAMESPACE,
                ttl=s.ttl,
                stale_ttl=s.stale_ttl,
                lease_ttl=s.lease_ttl,
                tag_check_interval=s.tag_check_interval,
            ) as sf:
                await asyncio.gather(*(self.reader(_OnLoop(sf), 50_000 + i) for i in range(s.async_readers)))
        finally:
            await client.aclose()

    def writer(self, sf: stampede.Stampede, seed: int) -> None:
        rng = random.Random(seed)
        s = self.scenario
        kinds, weights = list(WRITES), list(WRITES.values())
        while not self.stop.wait(s.write_every):
            (kind,) = rng.choices(kinds, weights)
            key = f"k{rng.randrange(s.keys)}"
            tag = self.tag_of(key)
            try:
                with self.writing:
                    self.write(sf, kind, key, tag)
            except stampede.StampedeError as exc:
                # Redis full (noeviction) refuses writes: the writer knows; nothing is required.
                with self.lock:
                    self.outcome.errors[f"{kind}: {type(exc).__name__}"] += 1
                continue
            with self.lock:
                self.outcome.writes[kind] += 1

    def write(self, sf: stampede.Stampede, kind: str, key: str, tag: str) -> None:
        """One write of ``kind``; once it returned, what reads may serve is raised."""
        s = self.scenario
        database, rules = self.database, self.rules
        began = time.monotonic()
        if kind in ("set", "delete", "invalidate"):
            with database.lock:
                database.keys[key] += 1
                version = database.keys[key]
            if kind == "set":
                versions = database.read(key, tag)
                sf.set(key, (key, *versions, time.monotonic(), b"s" * s.value_bytes), tags=[tag])
            elif kind == "delete":
                sf.delete(key)
            else:
                sf.invalidate(key)
            rules.require("k:" + key, version, began, deleted=kind == "delete")
        elif kind in ("invalidate_tags", "delete_tags"):
            with database.lock:
                database.tags[tag] += 1
                version = database.tags[tag]
            if kind == "delete_tags":
                sf.delete_tags(tag)
            else:
                sf.invalidate_tags(tag)
            rules.require("t:" + tag, version, began, deleted=kind == "delete_tags")
        else:
            with database.lock:
                database.namespace += 1
                version = database.namespace
            sf.invalidate_all()
            rules.require("ns", version, began, deleted=False)

    def filler(self) -> None:
        """Writes keys of its own at ``filler_rate`` per second, living 1 to 30 s."""
        s = self.scenario
        rng = random.Random(0)
        client = redis.Redis.from_url(self.url, socket_timeout=5)
        payload = b"f" * s.filler_bytes
        period = 1.0 / s.filler_rate
        n = 0
        next_at = time.monotonic()
        try:
            while not self.stop.is_set():
                pipe = client.pipeline(transaction=False)
                for _ in range(10):
                    pipe.set(f"filler:{n}", payload, px=rng.randint(1000, 30_000))
                    n += 1
                try:
                    pipe.execute()
                except redis.exceptions.ResponseError:
                    pass  # noeviction: Redis is full, as it should be
                next_at += 10 * period
                delay = next_at - time.monotonic()
                if delay > 0:
                    self.stop.wait(delay)
                else:
                    next_at = time.monotonic()
        finally:
            client.close()

    def watch_evictions(self) -> None:
        client = redis.Redis.from_url(self.url)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe("__keyevent@0__:evicted")
        try:
            while not self.stop.is_set():
                message = pubsub.get_message(timeout=0.1)
                if message is not None:
                    name = bytes(message["data"])
                    kind = kind_of(name)
                    with self.lock:
                        self.outcome.evicted[kind] += 1
                        self.losses.append((time.monotonic(), kind, name))
        finally:
            pubsub.close()
            client.close()

    def losses_by_key(self) -> dict[str, list[float]]:
        """When something each key's value needs was evicted: the value, its tag's state or the
        namespace's state."""
        s = self.scenario
        by_key: dict[str, list[float]] = defaultdict(list)
        keys = [f"k{i}" for i in range(s.keys)]
        for at, kind, name in self.losses:
            if kind == "value":
                by_key[name.decode().rpartition("{")[2]].append(at)
            elif kind == "tag state":
                tag = name.decode().rpartition("{")[2].partition("}")[0]
                for key in keys:
                    if self.tag_of(key) == tag:
                        by_key[key].append(at)
            elif kind == "namespace state":
                for key in keys:
                    by_key[key].append(at)
        return by_key

    def run(self) -> Outcome:
        s = self.scenario
        with ExitStack() as stack:
            for i in range(s.instances):
                client = redis.Redis.from_url(self.url, socket_timeout=5)
                stack.callback(client.close)
                near = stampede.NearCache(max_entries=1000) if s.near and i == s.instances - 1 else None
                sf = stampede.Stampede(
                    client,
                    namespace=NAMESPACE,
                    ttl=s.ttl,
                    stale_ttl=s.stale_ttl,
                    lease_ttl=s.lease_ttl,
                    near_cache=near,
                    tag_check_interval=s.tag_check_interval,
                )
                stack.callback(sf.close)
                self.instances.append(sf)
            threads = [threading.Thread(target=self.watch_evictions, daemon=True)]
            threads.append(threading.Thread(target=self.filler, daemon=True))
            if s.async_readers:
                threads.append(
                    threading.Thread(target=lambda: asyncio.run(self.async_instance()), daemon=True)
                )
            for i, sf in enumerate(self.instances):
                threads += [
                    threading.Thread(
                        target=_inline, args=(self.reader(_Inline(sf), i * 100 + t),), daemon=True
                    )
                    for t in range(s.readers)
                ]
                if i < s.writers:
                    threads.append(threading.Thread(target=self.writer, args=(sf, 10_000 + i), daemon=True))
            for thread in threads:
                thread.start()
            self.stop.wait(s.seconds)
            self.stop.set()
            for thread in threads:
                thread.join(30.0)
        outcome = self.outcome
        outcome.rebuilds = sum(len(starts) for starts in self.rebuilds.starts.values())
        outcome.most_at_once = self.rebuilds.most_at_once
        outcome.most_in_a_window = self.rebuilds.most_within(s.ttl)
        outcome.most_in_a_kept_window = self.rebuilds.most_within(s.ttl, self.losses_by_key())
        return outcome


@contextmanager
def served(policy: str, maxmemory: str) -> Iterator[str]:
    """A fresh redis-server with ``maxmemory`` under ``policy``, telling of its evictions; its URL."""
    args = ["--maxmemory", maxmemory, "--maxmemory-policy", policy, "--notify-keyspace-events", "Ee"]
    with RedisServer(args=args) as server:
        yield server.url


def run(scenario: Scenario, policy: str) -> Outcome:
    """One run of ``scenario`` under ``policy``, on a fresh server."""
    with served(policy, scenario.maxmemory) as url:
        return Evicting(scenario, policy, url).run()
