"""The module-level ``stampede.get_or_rebuild`` and its default instance."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ._exceptions import ConfigurationError
from ._sync.stampede import Stampede

__all__ = ["configure", "default", "get_or_rebuild"]

T = TypeVar("T")

_ENV_VARS = ("STAMPEDE_REDIS_URL", "REDIS_URL")
_lock = threading.Lock()
_default: Stampede | None = None


def configure(instance: Stampede | None) -> None:
    """Make ``instance`` the default used by :func:`get_or_rebuild` (``None``: reset)."""
    global _default
    if instance is not None and not isinstance(instance, Stampede):
        raise ConfigurationError(f"configure() takes a stampede.Stampede, got {instance!r}", field="instance")
    with _lock:
        previous, _default = _default, instance
    if previous is not None and previous is not instance:
        previous.close()  # closes its client only if it made it (from a URL)


def default() -> Stampede:
    """The default instance, created on first use from ``STAMPEDE_REDIS_URL``
    or, failing that, ``REDIS_URL``."""
    global _default
    with _lock:
        if _default is None:
            url = next((os.environ[name] for name in _ENV_VARS if os.environ.get(name)), None)
            if url is None:
                raise ConfigurationError(
                    "no default Redis: set STAMPEDE_REDIS_URL or REDIS_URL, "
                    "or call stampede.configure(Stampede(...))"
                )
            _default = Stampede.from_url(url)
        return _default


def get_or_rebuild(key: str | bytes, rebuild: Callable[[], T], **options: Any) -> T:
    """:meth:`Stampede.get_or_rebuild` on the default instance."""
    return default().get_or_rebuild(key, rebuild, **options)
