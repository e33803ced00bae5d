"""Keys for decorated functions, and the attributes the decorators add."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, cast

from .._exceptions import ConfigurationError

__all__ = ["CachedFunction", "check_decorated", "function_key", "key_builder"]

R = TypeVar("R", covariant=True)

_MAX_READABLE = 200


class CachedFunction(Protocol, Generic[R]):
    """A function decorated by ``Stampede.cached``.

    ``key(*args, **kwargs)`` is the cache key of a call; ``invalidate`` marks
    that call's value stale (served while refreshed); ``delete`` removes it.
    With ``stampede.asyncio``, the call, ``invalidate`` and ``delete`` are
    coroutines.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> R: ...

    def key(self, *args: Any, **kwargs: Any) -> str: ...

    def invalidate(self, *args: Any, **kwargs: Any) -> Any: ...

    def delete(self, *args: Any, **kwargs: Any) -> Any: ...

    @staticmethod
    def attach(
        wrapper: Callable[..., Any],
        key_of: Callable[..., str],
        invalidate: Callable[[str], Any],
        delete: Callable[[str], Any],
    ) -> CachedFunction[Any]:
        """Give ``wrapper`` the ``key``, ``invalidate`` and ``delete`` attributes."""
        function = cast(Any, wrapper)
        function.key = key_of
        function.invalidate = lambda *args, **kwargs: invalidate(key_of(*args, **kwargs))
        function.delete = lambda *args, **kwargs: delete(key_of(*args, **kwargs))
        return cast(CachedFunction[Any], function)


def check_decorated(func: Any, *, asynchronous: bool) -> None:
    """Refuse an ``async def`` function to the blocking flavour's ``cached()``
    (``asynchronous``: the asyncio flavour's, which calls plain functions in a
    worker thread and awaits coroutine functions: both will do)."""
    if asynchronous or not (inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)):
        return
    name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"
    raise ConfigurationError(
        f"cached() of stampede.Stampede cannot decorate {name}: it is an async function, and the "
        "blocking Stampede would cache the coroutine each call returns, unawaited: decorate it with "
        "the cached() of a stampede.asyncio.Stampede (or make it a plain def)",
        field="func",
    )


def function_key(func: Callable[..., Any]) -> Callable[..., str]:
    """The function that turns a call of ``func`` into its cache key:
    ``"module.qualname(arg=repr, ...)"``, the same however the arguments are
    spelled, hashed past 200 characters. Refuses arguments whose ``repr``
    differs between processes (``<object at 0x...>``)."""
    return key_builder(func, None)


def key_builder(func: Callable[..., Any], key: str | Callable[..., str] | None) -> Callable[..., str]:
    """The function that turns a call's arguments into its cache key."""
    if isinstance(key, str):
        if not key:
            raise ConfigurationError("key must not be empty", field="key")
        return lambda *args, **kwargs: key
    if key is not None:
        if not callable(key):
            raise ConfigurationError(f"key must be a str or a callable, got {key!r}", field="key")
        return key
    if not callable(func):
        raise ConfigurationError(f"cached() decorates functions, got {func!r}", field="func")
    name = f"{func.__module__}.{func.__qualname__}"
    signature = inspect.signature(func)
    var_keyword = {p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD}

    def key_of(*args: Any, **kwargs: Any) -> str:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        parts = []
        for param, value in bound.arguments.items():
            if param in var_keyword:
                value = dict(sorted(value.items()))  # f(a=1, b=2) and f(b=2, a=1) are one call
            text = repr(value)
            if " at 0x" in text:
                # The address differs in every process: the cache would never hit.
                raise ConfigurationError(
                    f"argument {param!r} of {name} has no stable repr ({text[:80]}); "
                    "give the decorator a key= (a string, or a function of the same arguments)",
                    field="key",
                )
            parts.append(f"{param}={text}")
        arguments = ",".join(parts)
        if len(arguments) > _MAX_READABLE:
            arguments = "sha256:" + hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{name}({arguments})"

    return key_of
