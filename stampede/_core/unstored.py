"""A rebuild's result for its callers alone: :class:`Unstored`."""

from __future__ import annotations

from typing import Any

__all__ = ["Unstored"]


class Unstored:
    """What a rebuild function returns to hand ``value`` to its callers (and
    to the callers of its process waiting on it) without storing it: an empty
    result not worth caching, a ``None`` that must not read as a stored one.

    Unlike a rebuild that raises, it is no failure: the lease is freed at
    once, and the next caller rebuilds without a back-off.

    >>> sf.get_or_rebuild("user:7", lambda: load(7) or stampede.Unstored(None))
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Unstored({self.value!r})"
