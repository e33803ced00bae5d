"""A lock per key, for callers of one process that update a key in turn."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["KeyLocks"]

L = TypeVar("L")


class KeyLocks(Generic[L]):
    """A lock per key, kept while callers of this process hold or wait for
    it, so that they update the key in turn: a compare-and-set lost to a
    caller of the same process is round trips spent for nothing. Used by
    both drivers; only the lock type differs."""

    def __init__(self, factory: Callable[[], L]) -> None:
        self._factory = factory
        self._locks: dict[Hashable, tuple[L, int]] = {}  # key -> (lock, callers holding or waiting)
        self._guard = threading.Lock()

    def take(self, key: Hashable) -> L:
        """The key's lock, counted as used until :meth:`give_back`."""
        with self._guard:
            lock, users = self._locks.get(key) or (self._factory(), 0)
            self._locks[key] = (lock, users + 1)
            return lock

    def give_back(self, key: Hashable) -> None:
        with self._guard:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
