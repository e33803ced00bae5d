"""The few settings both example apps read from the environment.

``REDIS_URL``: where the cache lives (default ``redis://127.0.0.1:6379/0``).
``EXAMPLE_CACHE``: ``stampede`` (default) or ``stock``, the framework's own
Redis cache. ``EXAMPLE_TTL``: seconds a page is fresh; ``EXAMPLE_STALE_TTL``:
seconds after that it may be served stale. ``EXAMPLE_REBUILD_SECONDS``: how
long the expensive part takes. ``EXAMPLE_WAIT_TIMEOUT``: how long a request
waits for another's rebuild. ``EXAMPLE_KEY_PREFIX``: a prefix for every
cache key, so one Redis can hold several runs apart. ``EXAMPLE_DATABASE``:
the SQLite file of the Django site's products (default: one in the temporary
directory, per key prefix).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Literal

__all__ = ["ExampleConfig", "load"]

CacheKind = Literal["stampede", "stock"]


@dataclass(frozen=True)
class ExampleConfig:
    """What the example site and app are configured with, read from the environment."""

    redis_url: str
    cache: CacheKind
    ttl: int
    stale_ttl: int
    rebuild_seconds: float
    wait_timeout: float
    key_prefix: str
    database: str = ""

    @property
    def database_path(self) -> str:
        """Where the Django site keeps its products."""
        return self.database or os.path.join(tempfile.gettempdir(), f"stampede-{self.key_prefix}.sqlite3")


def _number(name: str, default: str, kind: type[float] | type[int]) -> float:
    raw = os.environ.get(name, default)
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {raw!r}")
    return value


def load() -> ExampleConfig:
    """The settings from the environment; a clear error naming the bad variable."""
    cache = os.environ.get("EXAMPLE_CACHE", "stampede")
    if cache not in ("stampede", "stock"):
        raise ValueError(f"EXAMPLE_CACHE must be 'stampede' or 'stock', got {cache!r}")
    rebuild_seconds = _number("EXAMPLE_REBUILD_SECONDS", "1.0", float)
    return ExampleConfig(
        redis_url=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0",
        cache=cache,  # type: ignore[arg-type]
        ttl=int(_number("EXAMPLE_TTL", "10", int)),
        stale_ttl=int(_number("EXAMPLE_STALE_TTL", "300", int)),
        rebuild_seconds=rebuild_seconds,
        # Waiting requests should outlast the rebuild they wait for, however slow it is made.
        wait_timeout=_number("EXAMPLE_WAIT_TIMEOUT", str(max(10.0, 3 * rebuild_seconds)), float),
        key_prefix=os.environ.get("EXAMPLE_KEY_PREFIX", "example"),
        database=os.environ.get("EXAMPLE_DATABASE", ""),
    )
