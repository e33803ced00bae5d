"""``Stampede.memoize``: a function's results cached per arguments (sync or
async functions), one call per expiry across every process."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import stampede

from ._state import state, tags_of

__all__ = ["memoized"]

F = TypeVar("F", bound=Callable[..., Any])


def memoized(
    overrides: dict[str, Any],
    *,
    unless: Callable[[], bool] | None,
    cache_none: bool,
    key: str | Callable[..., str] | None,
    tags: Sequence[str] | Callable[..., Sequence[str]],
) -> Callable[[F], F]:
    """The decorator of :meth:`flask_stampede.Stampede.memoize`, with the
    options it sets (``overrides``) checked."""

    def decorate(func: F) -> F:
        if isinstance(key, str):
            fixed = key
            key_of: Callable[..., str] = lambda *args, **kwargs: fixed  # noqa: E731
        else:
            key_of = key if key is not None else stampede.function_key(func)

        def checked(result: Any) -> Any:
            return stampede.Unstored(None) if result is None and not cache_none else result

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if unless is not None and unless():
                    return await func(*args, **kwargs)

                async def call() -> Any:
                    return checked(await func(*args, **kwargs))

                # Inline refresh only: Flask cancels the tasks of an async
                # view when it returns, a background task among them.
                inline = {**overrides, "background": False, "tags": tags_of(tags, args, kwargs)}
                return await state().async_core().get_or_rebuild(key_of(*args, **kwargs), call, **inline)

            wrapper: Any = async_wrapper
        else:

            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                if unless is not None and unless():
                    return func(*args, **kwargs)
                return state().core.get_or_rebuild(
                    key_of(*args, **kwargs),
                    lambda: checked(func(*args, **kwargs)),
                    tags=tags_of(tags, args, kwargs),
                    **overrides,
                )

            wrapper = sync_wrapper
        wrapper.key = key_of
        wrapper.delete = lambda *args, **kwargs: state().core.delete(key_of(*args, **kwargs))
        wrapper.invalidate = lambda *args, **kwargs: state().core.invalidate(key_of(*args, **kwargs))
        wrapper.uncached = func
        return wrapper  # type: ignore[no-any-return]

    return decorate
