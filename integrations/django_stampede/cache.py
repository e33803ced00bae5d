"""The Django cache backend: ``"BACKEND": "django_stampede.StampedeCache"``.

A drop-in for ``django.core.cache.backends.redis.RedisCache`` whose ``get``
protects code that only calls ``get`` and ``set`` (``cache_page``, the cache
middleware, ``{% cache %}``, cache-aside in views): when an entry is stale,
one caller's ``get`` misses and holds the lease while the others get the
stale value; when it is missing, one caller misses and the others wait for
its ``set``. The lease belongs to the request (the current thread or task)
and that request's ``set`` commits it.

The class is made of its parts, each method written once as a plan that its
sync and async twins run (``_plans``): the reads (``_reads``), the writes
(``_writes``), the single-flight calls (``_single_flight``); this module
adds what only this backend has, and the groups.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.signals import got_request_exception, request_finished, request_started

from stampede import ConfigurationError, Stampede
from stampede.asyncio import Stampede as AsyncStampede

from . import _leases as leases
from ._config import CacheConfig, options_of
from ._plans import Plan, call
from ._reads import Reads
from ._recording import alias_of, instrument
from ._registry import async_core, sync_core
from ._single_flight import SingleFlight
from ._writes import PAGE_TAGS, Writes

# Settle each request's leases when it ends (not in close(): under ASGI
# Django closes caches from another context than the view's).
request_started.connect(leases.begin_request, dispatch_uid="django_stampede.begin_request")
got_request_exception.connect(leases.fail_request, dispatch_uid="django_stampede.fail_request")
request_finished.connect(leases.end_request, dispatch_uid="django_stampede.end_request")

__all__ = ["PAGE_TAGS", "StampedeCache"]


class StampedeCache(Reads, Writes, SingleFlight):
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
    LOCATION, as django-redis), ``TAG_CHECK_INTERVAL``, ``COMPRESS_ABOVE`` and
    ``RECORD_CALLS`` (``True``: the cache's calls are recorded for the debug
    toolbar panel, ``django_stampede.debug_toolbar.StampedePanel``, and the
    ``X-Cache`` header, ``django_stampede.middleware.CacheHeaderMiddleware``;
    at the cost of an event per call, hits included).
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
        if self._config.record_calls:
            instrument(self, alias_of(server, params))

    # --- what only this backend has ---------------------------------------------

    @property
    def stampede(self) -> Stampede:
        """The blocking :class:`Stampede` behind this cache, shared by the
        caches of the same ``LOCATION`` and options: its keys are raw (give it
        ``make_key(key)``) and its ``ttl`` is its own (pass ``ttl=``), not the
        cache's ``KEY_PREFIX``, ``VERSION`` or ``TIMEOUT``."""
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

    def invalidate(self, key: Any, version: int | None = None) -> bool:
        """Mark ``key`` stale: still served while one caller refreshes it."""
        return self._run(self._on_key("invalidate", key, version))

    async def ainvalidate(self, key: Any, version: int | None = None) -> bool:
        return await self._arun(self._on_key("invalidate", key, version))

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

    def _groups(self, method: str, tags: tuple[str, ...]) -> Plan[None]:
        yield call(method, *tags)

    # --- the end of a request -------------------------------------------------------

    def close(self, **kwargs: Any) -> None:
        """Cheap: connections stay pooled, and the request's leases are settled
        by a ``request_finished`` receiver of this module (see
        :func:`django_stampede.lease_scope` for units of work outside requests)."""

    async def aclose(self, **kwargs: Any) -> None:
        """See :meth:`close`."""
