"""The Django cache backend: ``"BACKEND": "django_stampede.StampedeCache"``.

A drop-in for ``django.core.cache.backends.redis.RedisCache`` whose ``get``
protects code that only calls ``get`` and ``set`` (``cache_page``, the cache
middleware, ``{% cache %}``, cache-aside in views): when an entry is stale,
one caller's ``get`` misses and holds the lease while the others get the
stale value; when it is missing, one caller misses and the others wait for
its ``set``. The lease belongs to the request (the current thread or task)
and that request's ``set`` commits it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache
from django.core.signals import request_finished, request_started

from stampede import Entry, Read, SerializationError, Stampede
from stampede.asyncio import Stampede as AsyncStampede

from . import _leases as leases
from ._config import CacheConfig, options_of
from ._registry import async_core, sync_core

# Settle each request's leases when it ends (not in close(): under ASGI
# Django closes caches from another context than the view's).
request_started.connect(leases.begin_request, dispatch_uid="django_stampede.begin_request")
request_finished.connect(leases.end_request, dispatch_uid="django_stampede.end_request")

__all__ = ["StampedeCache"]

# cache_page stores a page under two keys: the list of headers the page
# varies on, then the page itself, and reads them in that order.
_HEADER_KEY_PREFIX = "views.decorators.cache.cache_header."


class StampedeCache(BaseCache):
    """Django's cache API on Redis, with stampede protection in ``get``,
    ``get_or_set`` and their async twins. ``OPTIONS`` take stampede's
    settings in capitals (``STALE_TTL``, ``LEASE_TTL``, ``WAIT_TIMEOUT``...)
    and redis-py connection options in lower case."""

    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        options_of(params)  # BaseCache reads OPTIONS too, and would fail obscurely
        super().__init__(params)
        self._config = CacheConfig.from_django(server, params)
        self._core = sync_core(self._config)  # shared with every instance alike; validates

    # --- what only this backend has ---------------------------------------------

    @property
    def stampede(self) -> Stampede:
        """The blocking :class:`Stampede` behind this cache."""
        return self._core

    @property
    def astampede(self) -> AsyncStampede:
        """The :class:`AsyncStampede` behind this cache, on the running loop."""
        return async_core(self._config)

    def get_backend_timeout(self, timeout: Any = DEFAULT_TIMEOUT) -> int | None:
        """``None``: never expires; ``0``: do not store (as Django's ``RedisCache``)."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        return None if timeout is None else max(0, int(timeout))

    def ttl(self, key: Any, version: int | None = None) -> float | None:
        """Seconds until the value of ``key`` goes stale: ``0`` if missing or
        already stale, ``None`` if it never does."""
        return _remaining(self._core.get(self.make_and_validate_key(key, version=version)))

    async def attl(self, key: Any, version: int | None = None) -> float | None:
        return _remaining(await self.astampede.get(self.make_and_validate_key(key, version=version)))

    def invalidate(self, key: Any, version: int | None = None) -> bool:
        """Mark ``key`` stale: still served while one caller refreshes it."""
        return self._core.invalidate(self.make_and_validate_key(key, version=version))

    async def ainvalidate(self, key: Any, version: int | None = None) -> bool:
        return await self.astampede.invalidate(self.make_and_validate_key(key, version=version))

    # --- reading ----------------------------------------------------------------

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        made = self.make_and_validate_key(key, version=version)
        if leases.holds(self._config, made) or _is_header_key(key):
            # Our own rebuild (never wait for ourselves), or a header list:
            # served stale, so that only the page's own lease decides who renders.
            entry = self._core.get(made)
            if entry is not None and (entry.is_fresh() or _is_header_key(key)):
                return entry.value
            if leases.holds(self._config, made):
                return default
        read = self._core.read(made)
        return self._after_read(made, read, default)

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        made = self.make_and_validate_key(key, version=version)
        core = self.astampede
        if leases.holds(self._config, made) or _is_header_key(key):
            entry = await core.get(made)
            if entry is not None and (entry.is_fresh() or _is_header_key(key)):
                return entry.value
            if leases.holds(self._config, made):
                return default
        read = await core.read(made)
        return self._after_read(made, read, default)

    def _after_read(self, made: str, read: Read, default: Any) -> Any:
        if read.found:
            return read.value
        if read.lease is not None:
            leases.hold(self._config, made, read.lease)
        return default

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        named = {self.make_and_validate_key(key, version=version): key for key in keys}
        return {named[made]: value for made, value in self._core.get_many(named).items()}

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        named = {self.make_and_validate_key(key, version=version): key for key in keys}
        return {named[made]: value for made, value in (await self.astampede.get_many(named)).items()}

    def has_key(self, key: Any, version: int | None = None) -> bool:
        return self._core.has_key(self.make_and_validate_key(key, version=version))

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        return await self.astampede.has_key(self.make_and_validate_key(key, version=version))

    # --- writing ----------------------------------------------------------------

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> None:
        with _as_django():
            made = self.make_and_validate_key(key, version=version)
            ttl = self.get_backend_timeout(timeout)
            lease = leases.take(self._config, made)
            if ttl == 0:
                self._core.delete(made)
            elif lease is None:
                self._core.set(made, value, ttl=ttl)
            elif _is_header_key(key):
                leases.defer(self._config, lease, value, ttl)
                return
            else:
                self._core.commit(lease, value, ttl=ttl, store_if_lapsed=True)
            self._commit_deferred()

    async def aset(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> None:
        with _as_django():
            made = self.make_and_validate_key(key, version=version)
            ttl = self.get_backend_timeout(timeout)
            lease = leases.take(self._config, made)
            core = self.astampede
            if ttl == 0:
                await core.delete(made)
            elif lease is None:
                await core.set(made, value, ttl=ttl)
            elif _is_header_key(key):
                leases.defer(self._config, lease, value, ttl)
                return
            else:
                await core.commit(lease, value, ttl=ttl, store_if_lapsed=True)
            await self._acommit_deferred()

    def _commit_deferred(self) -> None:
        # The page is stored: now announce its header list, so that requests
        # woken by it find the page too.
        for lease, value, ttl in leases.take_deferred(self._config):
            self._core.commit(lease, value, ttl=ttl, store_if_lapsed=True)

    async def _acommit_deferred(self) -> None:
        for lease, value, ttl in leases.take_deferred(self._config):
            await self.astampede.commit(lease, value, ttl=ttl, store_if_lapsed=True)

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        with _as_django():
            made = self.make_and_validate_key(key, version=version)
            ttl = self.get_backend_timeout(timeout)
            lease = leases.take(self._config, made)
            added = self._core.add(made, value, ttl=1 if ttl == 0 else ttl)
            if added and ttl == 0:
                self._core.delete(made)  # what would have been added, but stored for no time
            if lease is not None:
                self._core.release(lease)
            return added

    async def aadd(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        with _as_django():
            made = self.make_and_validate_key(key, version=version)
            ttl = self.get_backend_timeout(timeout)
            lease = leases.take(self._config, made)
            core = self.astampede
            added = await core.add(made, value, ttl=1 if ttl == 0 else ttl)
            if added and ttl == 0:
                await core.delete(made)
            if lease is not None:
                await core.release(lease)
            return added

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        made = self.make_and_validate_key(key, version=version)
        ttl = self.get_backend_timeout(timeout)
        if ttl == 0:
            return self._core.delete(made)
        return self._core.touch(made, ttl=ttl)

    async def atouch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        made = self.make_and_validate_key(key, version=version)
        ttl = self.get_backend_timeout(timeout)
        if ttl == 0:
            return await self.astampede.delete(made)
        return await self.astampede.touch(made, ttl=ttl)

    def delete(self, key: Any, version: int | None = None) -> bool:
        made = self.make_and_validate_key(key, version=version)
        leases.take(self._config, made)  # the write cancels it in Redis
        return self._core.delete(made)

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        made = self.make_and_validate_key(key, version=version)
        leases.take(self._config, made)
        return await self.astampede.delete(made)

    def set_many(
        self, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> list[Any]:
        with _as_django():
            if not data:
                return []
            safe = self._made_items(data, version)
            ttl = self.get_backend_timeout(timeout)
            if ttl == 0:
                self._core.delete_many(safe)
            else:
                self._core.set_many(safe, ttl=ttl)
            return []

    async def aset_many(
        self, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> list[Any]:
        with _as_django():
            if not data:
                return []
            safe = self._made_items(data, version)
            ttl = self.get_backend_timeout(timeout)
            if ttl == 0:
                await self.astampede.delete_many(safe)
            else:
                await self.astampede.set_many(safe, ttl=ttl)
            return []

    def _made_items(self, data: dict[Any, Any], version: int | None) -> dict[str, Any]:
        safe = {}
        for key, value in data.items():
            made = self.make_and_validate_key(key, version=version)
            leases.take(self._config, made)  # the writes cancel them in Redis
            safe[made] = value
        return safe

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        made = [self.make_and_validate_key(key, version=version) for key in keys]
        for name in made:
            leases.take(self._config, name)
        self._core.delete_many(made)  # sends nothing for no keys

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        made = [self.make_and_validate_key(key, version=version) for key in keys]
        for name in made:
            leases.take(self._config, name)
        await self.astampede.delete_many(made)

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        made = self.make_and_validate_key(key, version=version)
        value = self._core.incr(made, delta)
        if value is None:
            raise ValueError(f"Key '{made}' not found.")
        return value

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        made = self.make_and_validate_key(key, version=version)
        value = await self.astampede.incr(made, delta)
        if value is None:
            raise ValueError(f"Key '{made}' not found.")
        return value

    def clear(self) -> bool:
        leases.forget_all(self._config)
        self._core.clear()
        return True

    async def aclear(self) -> bool:
        leases.forget_all(self._config)
        await self.astampede.clear()
        return True

    # --- single flight ------------------------------------------------------------

    def get_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> Any:
        with _as_django():
            made = self.make_and_validate_key(key, version=version)
            ttl = self.get_backend_timeout(timeout)
            lease = leases.take(self._config, made)
            if lease is not None or ttl == 0:
                # This request already holds the lease (its get missed), or
                # nothing is to be stored: compute here.
                value = default() if callable(default) else default
                if lease is not None and ttl == 0:
                    self._core.release(lease)
                elif lease is not None:
                    self._core.commit(lease, value, ttl=ttl, store_if_lapsed=True)
                return value
            return self._core.get_or_rebuild(made, _rebuilder(default), ttl=ttl)

    async def aget_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> Any:
        with _as_django():
            made = self.make_and_validate_key(key, version=version)
            ttl = self.get_backend_timeout(timeout)
            lease = leases.take(self._config, made)
            core = self.astampede
            if lease is not None or ttl == 0:
                value = default() if callable(default) else default
                if lease is not None and ttl == 0:
                    await core.release(lease)
                elif lease is not None:
                    await core.commit(lease, value, ttl=ttl, store_if_lapsed=True)
                return value
            return await core.get_or_rebuild(made, _rebuilder(default), ttl=ttl)

    # --- versions ----------------------------------------------------------------

    def incr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        # BaseCache's version reads through get(), which could hand this call a lease.
        version = self.version if version is None else version
        entry = self._core.get(self.make_and_validate_key(key, version=version))
        if entry is None:
            raise ValueError(f"Key '{key}' not found")
        self.set(key, entry.value, version=version + delta)
        self.delete(key, version=version)
        return version + delta

    async def aincr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        version = self.version if version is None else version
        entry = await self.astampede.get(self.make_and_validate_key(key, version=version))
        if entry is None:
            raise ValueError(f"Key '{key}' not found")
        await self.aset(key, entry.value, version=version + delta)
        await self.adelete(key, version=version)
        return version + delta

    # --- the end of a request -------------------------------------------------------

    def close(self, **kwargs: Any) -> None:
        """Cheap: connections stay pooled, and the request's leases are settled
        by a ``request_finished`` receiver of this module."""

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
