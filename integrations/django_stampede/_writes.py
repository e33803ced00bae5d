"""The backend's writes: ``set`` (which commits under the request's lease on
the key, if its ``get`` missed), ``add``, ``touch``, ``delete``, the batch
writes, ``incr``, ``clear``, ``incr_version`` and their async twins."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT

from stampede import Entry, Lease, SerializationError

from . import _leases as leases
from ._header_lists import commit_deferred, is_header_key, write_header
from ._plans import Plan, PlannedCache, call

__all__ = ["PAGE_TAGS", "Writes", "as_django"]

#: The attribute of a response that ``django_stampede.cache_page`` stores with
#: tags: the tags it is stored with.
PAGE_TAGS = "_stampede_tags"


@contextmanager
def as_django() -> Iterator[None]:
    """Raise what Django's own backends raise: the serializer's exception
    (``pickle.PickleError``...) for a value that cannot be stored."""
    try:
        yield
    except SerializationError as exc:
        if exc.__cause__ is None:
            raise
        raise exc.__cause__ from None


class Writes(PlannedCache):
    """The write path of :class:`~django_stampede.StampedeCache`."""

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
    ) -> Plan[None]:
        with as_django():
            made, ttl, lease = self._to_write(key, timeout, version)
            tags = tags or getattr(value, PAGE_TAGS, ())
            if ttl == 0:
                yield call("delete", made)
            elif is_header_key(key):
                if (yield from write_header(self._config, self._core.options, made, value, ttl, lease)):
                    return  # deferred: committed after its page
            elif lease is None:
                yield call("set", made, value, ttl=ttl, tags=tags)
            else:
                yield call("commit", lease, value, ttl=ttl, store_if_lapsed=True, tags=tags or None)
            yield from commit_deferred(self._config)

    def _to_write(self, key: Any, timeout: Any, version: int | None) -> tuple[str, int | None, Lease | None]:
        """The key to write, its timeout in Redis, and this request's lease on
        it (taken: the write settles it)."""
        made = self.make_and_validate_key(key, version=version)
        return made, self.get_backend_timeout(timeout), leases.take(self._config, made)

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
    ) -> Plan[bool]:
        with as_django():
            made, ttl, lease = self._to_write(key, timeout, version)
            added: bool = yield call("add", made, value, ttl=1 if ttl == 0 else ttl, tags=tags)
            if added and ttl == 0:
                yield call("delete", made)  # what would have been added, but stored for no time
            if lease is not None:
                yield call("release", lease)
            return added

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return self._run(self._touch(key, timeout, version))

    async def atouch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        return await self._arun(self._touch(key, timeout, version))

    def _touch(self, key: Any, timeout: Any, version: int | None) -> Plan[bool]:
        made = self.make_and_validate_key(key, version=version)
        ttl = self.get_backend_timeout(timeout)
        touched: bool = yield (call("delete", made) if ttl == 0 else call("touch", made, ttl=ttl))
        return touched

    def delete(self, key: Any, version: int | None = None) -> bool:
        return self._run(self._delete(key, version))

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        return await self._arun(self._delete(key, version))

    def _delete(self, key: Any, version: int | None) -> Plan[bool]:
        made = self.make_and_validate_key(key, version=version)
        leases.take(self._config, made)  # the write cancels it in Redis
        deleted: bool = yield call("delete", made)
        return deleted

    def set_many(
        self, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> list[Any]:
        return self._run(self._set_many(data, timeout, version))

    async def aset_many(
        self, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> list[Any]:
        return await self._arun(self._set_many(data, timeout, version))

    def _set_many(self, data: dict[Any, Any], timeout: Any, version: int | None) -> Plan[list[Any]]:
        with as_django():
            if not data:
                return []
            safe = {}
            for key, value in data.items():
                made = self.make_and_validate_key(key, version=version)
                leases.take(self._config, made)  # the writes cancel them in Redis
                safe[made] = value
            ttl = self.get_backend_timeout(timeout)
            if ttl == 0:
                yield call("delete_many", safe)
            else:
                yield call("set_many", safe, ttl=ttl)
            return []

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        self._run(self._delete_many(keys, version))

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        await self._arun(self._delete_many(keys, version))

    def _delete_many(self, keys: Iterable[Any], version: int | None) -> Plan[None]:
        made = [self.make_and_validate_key(key, version=version) for key in keys]
        for name in made:
            leases.take(self._config, name)
        yield call("delete_many", made)  # sends nothing for no keys

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return self._run(self._incr(key, delta, version))

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return await self._arun(self._incr(key, delta, version))

    def _incr(self, key: Any, delta: int, version: int | None) -> Plan[int]:
        made = self.make_and_validate_key(key, version=version)
        value: int | None = yield call("incr", made, delta)
        if value is None:
            raise ValueError(f"Key '{made}' not found.")
        return value

    def clear(self) -> bool:
        return self._run(self._clear())

    async def aclear(self) -> bool:
        return await self._arun(self._clear())

    def _clear(self) -> Plan[bool]:
        for lease in leases.forget_all(self._config):
            yield call("release", lease)  # stops its renewal; the clear deletes it anyway
        yield call("clear")
        return True

    def incr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return self._run(self._incr_version(key, delta, version))

    async def aincr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return await self._arun(self._incr_version(key, delta, version))

    def _incr_version(self, key: Any, delta: int, version: int | None) -> Plan[int]:
        # BaseCache's version reads through get(), which could hand this call a lease.
        version = self.version if version is None else version
        entry: Entry | None = yield call("get", self.make_and_validate_key(key, version=version))
        if entry is None:
            raise ValueError(f"Key '{key}' not found")
        yield from self._set(key, entry.value, DEFAULT_TIMEOUT, version + delta)
        yield from self._delete(key, version)
        return version + delta
