"""The backend's single flight: ``get_or_set`` and ``get_or_set_many`` (and
their async twins) compute each missing or stale key once across every
process, the other callers waiting for it or served the stale value."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT

from . import _leases as leases
from ._plans import Plan, PlannedCache, call, computed
from ._writes import as_django

__all__ = ["SingleFlight"]


class SingleFlight(PlannedCache):
    """The single-flight calls of :class:`~django_stampede.StampedeCache`."""

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
    ) -> Plan[Any]:
        with as_django():
            made = self.make_and_validate_key(key, version=version)
            ttl = self.get_backend_timeout(timeout)
            if ttl == 0 or leases.holds(self._config, made):
                # This request already holds the lease (its get missed: the
                # lease is renewed meanwhile), or nothing is to be stored:
                # compute here.
                value = default() if callable(default) else default
                lease = leases.take(self._config, made)
                if lease is not None and ttl == 0:
                    yield call("release", lease)
                elif lease is not None:
                    yield call("commit", lease, value, ttl=ttl, store_if_lapsed=True, tags=tags or None)
                return value
            rebuild = default if callable(default) else (lambda: default)
            return (yield call("get_or_rebuild", made, rebuild, ttl=ttl, tags=tags))

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
    ) -> Plan[dict[Any, Any]]:
        with as_django():
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
                built = by_name(mine, (yield computed(default_many, [named[name] for name in mine])))
            for name, lease in held.items():
                if ttl == 0 or name not in built:
                    yield call("release", lease)
                else:
                    yield call("commit", lease, built[name], ttl=ttl, store_if_lapsed=True, tags=tags or None)
            rest = [] if ttl == 0 else [name for name in named if name not in held]
            if rest:
                rebuild_many: Callable[[list[str]], Any]
                if inspect.iscoroutinefunction(default_many):  # aget_or_set_many's, awaited

                    async def rebuild_many(made: list[str]) -> Any:
                        return by_name(made, await default_many([named[name] for name in made]))

                else:

                    def rebuild_many(made: list[str]) -> Any:
                        return by_name(made, default_many([named[name] for name in made]))

                built.update((yield call("get_or_rebuild_many", rest, rebuild_many, ttl=ttl, tags=tags)))
            return {named[name]: built[name] for name in named if name in built}


def _mapping_of(built: Any) -> Any:
    if inspect.iscoroutine(built):
        built.close()
        raise TypeError("default_many is a coroutine function: call aget_or_set_many")
    if not hasattr(built, "items"):
        raise TypeError(f"default_many must return a dict of the keys it was given, got {built!r}")
    return built
