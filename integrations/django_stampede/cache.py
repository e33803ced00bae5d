"""The Django cache backend: ``"BACKEND": "django_stampede.StampedeCache"``.

A drop-in for ``django.core.cache.backends.redis.RedisCache`` whose ``get``
protects code that only calls ``get`` and ``set`` (``cache_page``, the cache
middleware, ``{% cache %}``, cache-aside in views): when an entry is stale,
one caller's ``get`` misses and holds the lease while the others get the
stale value; when it is missing, one caller misses and the others wait for
its ``set``. The lease belongs to the request (the current thread or task)
and that request's ``set`` commits it.

Each method is written once, as a plan: a generator that builds the key,
converts the timeout, takes or keeps the request's lease, and turns the
core's replies into Django's return value. It yields each call it needs of
the core (``_call("read", key)``) and receives the reply: the sync method
runs the plan with the blocking core (:meth:`StampedeCache._run`), its ``a``
twin with the asyncio core (:meth:`StampedeCache._arun`). Only ``get`` of a
key the request does not rebuild calls the core directly: a hit must not pay
for a generator.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import methodcaller
from typing import Any, TypeAlias, TypeVar

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache
from django.core.signals import got_request_exception, request_finished, request_started

from stampede import ConfigurationError, Entry, Lease, Read, SerializationError, Stampede
from stampede.asyncio import Stampede as AsyncStampede

from . import _leases as leases
from ._config import CacheConfig, options_of
from ._registry import async_core, sync_core

# Settle each request's leases when it ends (not in close(): under ASGI
# Django closes caches from another context than the view's).
request_started.connect(leases.begin_request, dispatch_uid="django_stampede.begin_request")
got_request_exception.connect(leases.fail_request, dispatch_uid="django_stampede.fail_request")
request_finished.connect(leases.end_request, dispatch_uid="django_stampede.end_request")

__all__ = ["PAGE_TAGS", "StampedeCache"]

#: The attribute of a response that ``django_stampede.cache_page`` stores with
#: tags: the tags it is stored with.
PAGE_TAGS = "_stampede_tags"

# cache_page stores a page under two keys: the list of headers the page
# varies on, then the page itself, and reads them in that order.
_HEADER_KEY_PREFIX = "views.decorators.cache.cache_header."

_T = TypeVar("_T")
#: A call of the backend: yields the core calls it needs, receives their
#: replies, and returns what the backend method returns.
_Plan: TypeAlias = Generator[Callable[[Any], Any], Any, _T]


def _call(method: str, *args: Any, **kwargs: Any) -> methodcaller:
    """The step of a plan that calls ``method`` of the core with these arguments."""
    return methodcaller(method, *args, **kwargs)


def _computed(function: Callable[..., Any], *args: Any) -> Callable[[Any], Any]:
    """The step of a plan that calls the user's ``function`` (awaited by ``_arun``
    if it returns an awaitable: an ``a*`` method's coroutine function)."""
    return lambda core: function(*args)


class StampedeCache(BaseCache):
    """Django's cache API on Redis, with stampede protection in ``get``,
    ``get_or_set`` and their async twins.

    ``LOCATION``: a Redis URL (``redis://``, ``rediss://``, ``unix://``,
    ``redis+cluster://``, ``redis+sentinel://``), or several: a primary and
    its replicas. ``TIMEOUT``: how long values stay fresh, as for any Django
    cache.

    ``OPTIONS`` in capitals are stampede's: ``STALE_TTL``, ``LEASE_TTL``,
    ``MAX_LEASE_TIME``, ``WAIT_TIMEOUT``, ``ON_WAIT_TIMEOUT``, ``BACKGROUND``,
    ``BETA``, ``FAIL_OPEN``, ``UNFILLED_TTL`` and ``MAX_VALUE_SIZE`` (those of
    :class:`stampede.Options`), ``NAMESPACE`` (default ``"django"``),
    ``SERIALIZER`` (``"pickle"``, the default, ``"json"``, ``"json+zlib"``...,
    a dotted path or a serializer), ``SIGNING_KEY`` (below), ``ON_EVENT``,
    ``NEAR_CACHE``, ``SENTINELS`` (with a ``redis://<service>/<db>``
    LOCATION, as django-redis), ``TAG_CHECK_INTERVAL`` and ``COMPRESS_ABOVE``.
    In lower case they are redis-py's connection options, as for Django's
    ``RedisCache``: the keyword arguments of its connection classes (``db``,
    ``socket_timeout``, ``ssl_ca_certs``..., described at
    https://redis.readthedocs.io/en/stable/connections.html),
    ``max_connections``, ``pool_class``, ``parser_class`` and
    ``connection_class`` (classes or dotted paths), and the keyword arguments
    of the pool and connection classes named (``timeout`` of a
    ``BlockingConnectionPool``). An unknown key (with the known one it is
    closest to), a key in the wrong case, an option the LOCATION's connections
    do not take, or an invalid value raises ``ImproperlyConfigured`` naming
    ``OPTIONS[key]`` as written.

    Values are signed, so that one someone else wrote to the Redis is a miss,
    never deserialized. ``SIGNING_KEY`` absent: with keys derived from
    ``SECRET_KEY`` (then ``SECRET_KEY_FALLBACKS``), and an empty
    ``SECRET_KEY`` is ``ImproperlyConfigured`` when the cache is made (at its
    first use through ``django.core.cache.caches``); a key (``str`` or
    ``bytes``, 16 bytes or more) or a list of them (the first signs, any
    verifies): those; ``None`` (or ``False``): values are stored unsigned,
    for a Redis no one else can write to.

    :attr:`stampede` is the blocking core behind the cache; :attr:`astampede`
    the asyncio one, for async code only.
    """

    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        options_of(params)  # BaseCache reads OPTIONS too, and would fail obscurely
        super().__init__(params)
        self._config = CacheConfig.from_django(server, params)
        self._core = sync_core(self._config)  # shared with every instance alike; validates

    # --- the two ways to run a plan ---------------------------------------------

    def _run(self, plan: _Plan[_T]) -> _T:
        """Run ``plan`` against the blocking core and return its result."""
        core = self._core
        try:
            call = next(plan)
            while True:
                try:
                    reply = call(core)
                except BaseException as exc:  # the plan sees the core's error at its call
                    call = plan.throw(exc)
                else:
                    call = plan.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def _arun(self, plan: _Plan[_T]) -> _T:
        """Run ``plan`` against the asyncio core of the running loop and return its result."""
        try:
            call = next(plan)
            core = async_core(self._config)  # looked up at the plan's first call: some make none
            while True:
                try:
                    reply = call(core)
                    if inspect.isawaitable(reply):  # the core's always; a user's function's maybe
                        reply = await reply
                except BaseException as exc:  # cancellation too: the plan sees it at its call
                    call = plan.throw(exc)
                else:
                    call = plan.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    # --- what only this backend has ---------------------------------------------

    @property
    def stampede(self) -> Stampede:
        """The blocking :class:`Stampede` behind this cache."""
        return self._core

    @property
    def astampede(self) -> AsyncStampede:
        """The :class:`AsyncStampede` behind this cache on the running event
        loop (one per loop: ``redis.asyncio`` connections belong to one), for
        async views and other code running on a loop. Outside of one it
        raises :class:`stampede.ConfigurationError`: sync code uses
        :attr:`stampede`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise ConfigurationError(
                "django_stampede: cache.astampede is the asyncio core, for async views and other "
                "code running on an event loop (await cache.astampede.get_or_rebuild(...)), and no "
                "event loop runs here: in sync code use cache.stampede, the blocking core"
            ) from None
        return async_core(self._config)

    def get_backend_timeout(self, timeout: Any = DEFAULT_TIMEOUT) -> int | None:
        """``None``: never expires; ``0``: do not store (as Django's ``RedisCache``)."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        return None if timeout is None else max(0, int(timeout))

    def ttl(self, key: Any, version: int | None = None) -> float | None:
        """Seconds until the value of ``key`` goes stale: ``0`` if missing or
        already stale, ``None`` if it never does."""
        return self._run(self._ttl(key, version))

    async def attl(self, key: Any, version: int | None = None) -> float | None:
        return await self._arun(self._ttl(key, version))

    def _ttl(self, key: Any, version: int | None) -> _Plan[float | None]:
        entry: Entry | None = yield _call("get", self.make_and_validate_key(key, version=version))
        return _remaining(entry)

    def invalidate(self, key: Any, version: int | None = None) -> bool:
        """Mark ``key`` stale: still served while one caller refreshes it."""
        return self._run(self._on_key("invalidate", key, version))

    async def ainvalidate(self, key: Any, version: int | None = None) -> bool:
        return await self._arun(self._on_key("invalidate", key, version))

    def _on_key(self, method: str, key: Any, version: int | None) -> _Plan[bool]:
        """The core's ``method`` (``has_key``, ``invalidate``) called on ``key``."""
        answer: bool = yield _call(method, self.make_and_validate_key(key, version=version))
        return answer

    # --- reading ----------------------------------------------------------------

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        made = self.make_and_validate_key(key, version=version)
        if _is_header_key(key):
            return self._run(self._get_header(made, default))
        # Not through a plan: its generator would add about 0.7 us a call, a
        # seventh of a hit served from the near cache.
        read = self._core.read(made, scope=leases.scope(self._config))
        return read.value if read.found else default

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        made = self.make_and_validate_key(key, version=version)
        if _is_header_key(key):
            return await self._arun(self._get_header(made, default))
        read = await async_core(self._config).read(made, scope=leases.scope(self._config))
        return read.value if read.found else default

    def _get_header(self, made: str, default: Any) -> _Plan[Any]:
        """``get`` of a header list (``cache_page``'s): served stale too, so that
        only the page's own lease decides who renders."""
        entry: Entry | None = yield _call("get", made)
        if entry is not None:
            return entry.value
        read: Read = yield _call("read", made, scope=leases.scope(self._config))
        return read.value if read.found else default

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        return self._run(self._get_many(keys, version))

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        return await self._arun(self._get_many(keys, version))

    def _get_many(self, keys: Iterable[Any], version: int | None) -> _Plan[dict[Any, Any]]:
        named = {self.make_and_validate_key(key, version=version): key for key in keys}
        found = yield _call("get_many", named)
        return {named[made]: value for made, value in found.items()}

    def has_key(self, key: Any, version: int | None = None) -> bool:
        return self._run(self._on_key("has_key", key, version))

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        return await self._arun(self._on_key("has_key", key, version))

    # --- writing ----------------------------------------------------------------

    def set(
        self,
        key: Any,
        value: Any,
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
        *,
        tags: Sequence[str] = (),
    ) -> None:
        """Store ``value``; ``tags``: the groups it belongs to (see
        :meth:`invalidate_tags`). A page stored by ``django_stampede.cache_page``
        carries the decorator's tags."""
        self._run(self._set(key, value, timeout, version, tags))

    async def aset(
        self,
        key: Any,
        value: Any,
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
        *,
        tags: Sequence[str] = (),
    ) -> None:
        await self._arun(self._set(key, value, timeout, version, tags))

    def _set(
        self, key: Any, value: Any, timeout: Any, version: int | None, tags: Sequence[str] = ()
    ) -> _Plan[None]:
        with _as_django():
            made, ttl, lease = self._to_write(key, timeout, version)
            tags = tags or _page_tags(value)
            if ttl == 0:
                yield _call("delete", made)
            elif _is_header_key(key):
                stale_ttl = self._header_stale_ttl()
                if lease is not None:
                    leases.defer(self._config, lease, value, ttl, stale_ttl)
                    return
                yield _call("set", made, value, ttl=ttl, stale_ttl=stale_ttl)
            elif lease is None:
                yield _call("set", made, value, ttl=ttl, tags=tags)
            else:
                yield _call("commit", lease, value, ttl=ttl, store_if_lapsed=True, tags=tags or None)
            yield from self._commit_deferred()

    def _to_write(self, key: Any, timeout: Any, version: int | None) -> tuple[str, int | None, Lease | None]:
        """The key to write, its timeout in Redis, and this request's lease on
        it (taken: the write settles it)."""
        made = self.make_and_validate_key(key, version=version)
        return made, self.get_backend_timeout(timeout), leases.take(self._config, made)

    def _commit_deferred(self) -> _Plan[None]:
        # The page is stored: now announce its header list, so that requests
        # woken by it find the page too.
        for lease, value, ttl, stale_ttl in leases.take_deferred(self._config):
            yield _call("commit", lease, value, ttl=ttl, stale_ttl=stale_ttl, store_if_lapsed=True)

    def _header_stale_ttl(self) -> float:
        """How long a header list is kept past its timeout: past its page's
        (``STALE_TTL``) and that page's next render (``MAX_LEASE_TIME`` at
        most). A header list outlives its page, so that the requests that
        find the page gone read the page's key, whose one lease decides who
        renders it; were the header list gone too, the request that took its
        lease would render the page beside the one holding the page's."""
        options = self._core.options
        return options.stale_ttl + options.max_lease_time

    def add(
        self,
        key: Any,
        value: Any,
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
        *,
        tags: Sequence[str] = (),
    ) -> bool:
        return self._run(self._add(key, value, timeout, version, tags))

    async def aadd(
        self,
        key: Any,
        value: Any,
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
        *,
        tags: Sequence[str] = (),
    ) -> bool:
        return await self._arun(self._add(key, value, timeout, version, tags))

    def _add(
        self, key: Any, value: Any, timeout: Any, version: int | None, tags: Sequence[str]
    ) -> _Plan[bool]:
        with _as_django():
            made, ttl, lease = self._to_write(key, timeout, version)
            added: bool = yield _call("add", made, value, ttl=1 if ttl == 0 else ttl, tags=tags)
            if added and ttl == 0:
                yield _call("delete", made)  # what would have been added, but stored for no time
            if lease is not None:
                yield _call("release", lease)
            return added

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return self._run(self._touch(key, timeout, version))

    async def atouch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return await self._arun(self._touch(key, timeout, version))

    def _touch(self, key: Any, timeout: Any, version: int | None) -> _Plan[bool]:
        made = self.make_and_validate_key(key, version=version)
        ttl = self.get_backend_timeout(timeout)
        touched: bool = yield (_call("delete", made) if ttl == 0 else _call("touch", made, ttl=ttl))
        return touched

    def delete(self, key: Any, version: int | None = None) -> bool:
        return self._run(self._delete(key, version))

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        return await self._arun(self._delete(key, version))

    def _delete(self, key: Any, version: int | None) -> _Plan[bool]:
        made = self.make_and_validate_key(key, version=version)
        leases.take(self._config, made)  # the write cancels it in Redis
        deleted: bool = yield _call("delete", made)
        return deleted

    def set_many(
        self, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> list[Any]:
        return self._run(self._set_many(data, timeout, version))

    async def aset_many(
        self, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> list[Any]:
        return await self._arun(self._set_many(data, timeout, version))

    def _set_many(self, data: dict[Any, Any], timeout: Any, version: int | None) -> _Plan[list[Any]]:
        with _as_django():
            if not data:
                return []
            safe = self._made_items(data, version)
            ttl = self.get_backend_timeout(timeout)
            if ttl == 0:
                yield _call("delete_many", safe)
            else:
                yield _call("set_many", safe, ttl=ttl)
            return []

    def _made_items(self, data: dict[Any, Any], version: int | None) -> dict[str, Any]:
        safe = {}
        for key, value in data.items():
            made = self.make_and_validate_key(key, version=version)
            leases.take(self._config, made)  # the writes cancel them in Redis
            safe[made] = value
        return safe

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        self._run(self._delete_many(keys, version))

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        await self._arun(self._delete_many(keys, version))

    def _delete_many(self, keys: Iterable[Any], version: int | None) -> _Plan[None]:
        made = [self.make_and_validate_key(key, version=version) for key in keys]
        for name in made:
            leases.take(self._config, name)
        yield _call("delete_many", made)  # sends nothing for no keys

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return self._run(self._incr(key, delta, version))

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return await self._arun(self._incr(key, delta, version))

    def _incr(self, key: Any, delta: int, version: int | None) -> _Plan[int]:
        made = self.make_and_validate_key(key, version=version)
        value: int | None = yield _call("incr", made, delta)
        if value is None:
            raise ValueError(f"Key '{made}' not found.")
        return value

    def clear(self) -> bool:
        return self._run(self._clear())

    async def aclear(self) -> bool:
        return await self._arun(self._clear())

    def _clear(self) -> _Plan[bool]:
        for lease in leases.forget_all(self._config):
            yield _call("release", lease)  # stops its renewal; the clear deletes it anyway
        yield _call("clear")
        return True

    # --- single flight ------------------------------------------------------------

    def get_or_set(
        self,
        key: Any,
        default: Any,
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
        *,
        tags: Sequence[str] = (),
    ) -> Any:
        return self._run(self._get_or_set(key, default, timeout, version, tags))

    async def aget_or_set(
        self,
        key: Any,
        default: Any,
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
        *,
        tags: Sequence[str] = (),
    ) -> Any:
        return await self._arun(self._get_or_set(key, default, timeout, version, tags))

    def _get_or_set(
        self, key: Any, default: Any, timeout: Any, version: int | None, tags: Sequence[str]
    ) -> _Plan[Any]:
        with _as_django():
            made = self.make_and_validate_key(key, version=version)
            ttl = self.get_backend_timeout(timeout)
            if ttl == 0 or leases.holds(self._config, made):
                # This request already holds the lease (its get missed: the
                # lease is renewed meanwhile), or nothing is to be stored:
                # compute here.
                value = default() if callable(default) else default
                lease = leases.take(self._config, made)
                if lease is not None and ttl == 0:
                    yield _call("release", lease)
                elif lease is not None:
                    yield _call("commit", lease, value, ttl=ttl, store_if_lapsed=True, tags=tags or None)
                return value
            return (yield _call("get_or_rebuild", made, _rebuilder(default), ttl=ttl, tags=tags))

    def get_or_set_many(
        self,
        keys: Iterable[Any],
        default_many: Callable[[list[Any]], Any],
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
        *,
        tags: Sequence[str] = (),
    ) -> dict[Any, Any]:
        """``get_or_set`` for many keys at once: ``{key: value}``.

        Fresh keys cost one Redis read for the whole batch.
        ``default_many(keys)`` is called once with the missing or stale keys
        this request won the right to rebuild, and returns a dict of them to
        their values (a key left out is neither stored nor returned); keys
        that another request rebuilds are waited for, or served stale. Each
        key is rebuilt once across every process."""
        return self._run(self._get_or_set_many(keys, default_many, timeout, version, tags))

    async def aget_or_set_many(
        self,
        keys: Iterable[Any],
        default_many: Callable[[list[Any]], Any],
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
        *,
        tags: Sequence[str] = (),
    ) -> dict[Any, Any]:
        return await self._arun(self._get_or_set_many(keys, default_many, timeout, version, tags))

    def _get_or_set_many(
        self,
        keys: Iterable[Any],
        default_many: Callable[[list[Any]], Any],
        timeout: Any,
        version: int | None,
        tags: Sequence[str],
    ) -> _Plan[dict[Any, Any]]:
        with _as_django():
            named = {self.make_and_validate_key(key, version=version): key for key in keys}
            ttl = self.get_backend_timeout(timeout)

            def by_name(made: list[str], built: Any) -> dict[str, Any]:
                built = _mapping_of(built)
                return {name: built[named[name]] for name in made if named[name] in built}

            # Keys this request already rebuilds (its get missed): computed here,
            # never waited for; with a timeout of 0, every key, and none stored.
            held = {name: lease for name in named if (lease := leases.take(self._config, name))}
            built: dict[str, Any] = {}
            mine = list(named) if ttl == 0 else list(held)
            if mine:
                built = by_name(mine, (yield _computed(default_many, [named[name] for name in mine])))
            for name, lease in held.items():
                if ttl == 0 or name not in built:
                    yield _call("release", lease)
                else:
                    yield _call(
                        "commit", lease, built[name], ttl=ttl, store_if_lapsed=True, tags=tags or None
                    )
            rest = [] if ttl == 0 else [name for name in named if name not in held]
            if rest:
                rebuild_many: Callable[[list[str]], Any]
                if inspect.iscoroutinefunction(default_many):  # aget_or_set_many's, awaited

                    async def rebuild_many(made: list[str]) -> Any:
                        return by_name(made, await default_many([named[name] for name in made]))

                else:

                    def rebuild_many(made: list[str]) -> Any:
                        return by_name(made, default_many([named[name] for name in made]))

                built.update((yield _call("get_or_rebuild_many", rest, rebuild_many, ttl=ttl, tags=tags)))
            return {named[name]: built[name] for name in named if name in built}

    # --- groups ---------------------------------------------------------------------

    def invalidate_tags(self, *tags: str) -> None:
        """Mark every entry carrying any of ``tags`` stale, in every process:
        each is served stale while one request refreshes it. One Redis command
        per tag, however many entries carry it."""
        self._run(self._groups("invalidate_tags", tags))

    async def ainvalidate_tags(self, *tags: str) -> None:
        await self._arun(self._groups("invalidate_tags", tags))

    def delete_tags(self, *tags: str) -> None:
        """Make every entry carrying any of ``tags`` read as missing: one request
        rebuilds each while the others wait."""
        self._run(self._groups("delete_tags", tags))

    async def adelete_tags(self, *tags: str) -> None:
        await self._arun(self._groups("delete_tags", tags))

    def invalidate_all(self) -> None:
        """Mark every entry of this cache stale (softly, as :meth:`invalidate_tags`);
        ``clear()`` is the hard one. One Redis command."""
        self._run(self._groups("invalidate_all", ()))

    async def ainvalidate_all(self) -> None:
        await self._arun(self._groups("invalidate_all", ()))

    def _groups(self, method: str, tags: tuple[str, ...]) -> _Plan[None]:
        yield _call(method, *tags)

    # --- versions ----------------------------------------------------------------

    def incr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return self._run(self._incr_version(key, delta, version))

    async def aincr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return await self._arun(self._incr_version(key, delta, version))

    def _incr_version(self, key: Any, delta: int, version: int | None) -> _Plan[int]:
        # BaseCache's version reads through get(), which could hand this call a lease.
        version = self.version if version is None else version
        entry: Entry | None = yield _call("get", self.make_and_validate_key(key, version=version))
        if entry is None:
            raise ValueError(f"Key '{key}' not found")
        yield from self._set(key, entry.value, DEFAULT_TIMEOUT, version + delta)
        yield from self._delete(key, version)
        return version + delta

    # --- the end of a request -------------------------------------------------------

    def close(self, **kwargs: Any) -> None:
        """Cheap: connections stay pooled, and the request's leases are settled
        by a ``request_finished`` receiver of this module (see
        :func:`django_stampede.lease_scope` for units of work outside requests)."""

    async def aclose(self, **kwargs: Any) -> None:
        """See :meth:`close`."""


@contextmanager
def _as_django() -> Iterator[None]:
    """Raise what Django's own backends raise: the serializer's exception
    (``pickle.PickleError``...) for a value that cannot be stored."""
    try:
        yield
    except SerializationError as exc:
        if exc.__cause__ is None:
            raise
        raise exc.__cause__ from None


def _mapping_of(built: Any) -> Any:
    if inspect.iscoroutine(built):
        built.close()
        raise TypeError("default_many is a coroutine function: call aget_or_set_many")
    if not hasattr(built, "items"):
        raise TypeError(f"default_many must return a dict of the keys it was given, got {built!r}")
    return built


def _page_tags(value: Any) -> Sequence[str]:
    """The tags ``django_stampede.cache_page`` gave a response it stores."""
    return getattr(value, PAGE_TAGS, ())


def _is_header_key(key: Any) -> bool:
    return isinstance(key, str) and key.startswith(_HEADER_KEY_PREFIX)


def _rebuilder(default: Any) -> Callable[[], Any]:
    return default if callable(default) else (lambda: default)


def _remaining(entry: Entry | None) -> float | None:
    if entry is None:
        return 0
    if entry.fresh_until == float("inf"):
        return None
    return max(0.0, entry.fresh_until - time.time())
