"""``cache_page``'s header lists: the headers a page varies on, which
``cache_page`` stores under a key of their own before the page, and reads
before it.

A header list is served stale too, and outlives its page, so that only
the page's own lease decides who renders it. While Redis is away, each
process reads the header lists it saw last, for the same reason.
"""

from __future__ import annotations

import threading
from typing import Any

from stampede import Entry, Lease, Options, Read

from . import _leases as leases
from ._config import CacheConfig
from ._plans import Plan, call

__all__ = ["commit_deferred", "is_header_key", "read_header", "write_header"]

#: What the key of a header list starts with (Django's ``cache_page`` names them so).
_HEADER_KEY_PREFIX = "views.decorators.cache.cache_header."

#: The most header lists a process remembers (a few hundred bytes each).
MOST_SEEN = 1024

#: The header lists this process read or wrote last, by Redis key: what it
#: reads while Redis is away. A header list only names the headers a page
#: varies on, the same for every version of the page: an old one costs at
#: worst a render.
_seen: dict[str, Any] = {}


_seen_lock = threading.Lock()


def _saw(made: str, value: Any) -> Any:
    """Remember ``value`` as the header list under ``made``; returns it."""
    if _seen.get(made) != value:  # a change is rare: a hit only reads
        with _seen_lock:
            if len(_seen) >= MOST_SEEN:
                del _seen[next(iter(_seen))]  # the oldest
            _seen[made] = value
    return value


def is_header_key(key: Any) -> bool:
    """Whether ``key`` (as the caller gave it) names a header list."""
    return isinstance(key, str) and key.startswith(_HEADER_KEY_PREFIX)


def read_header(config: CacheConfig, made: str, default: Any) -> Plan[Any]:
    """``get`` of a header list: a stale one is served as it is, so that only
    the page's own lease decides who renders."""
    entry: Entry | None = yield call("get", made)
    if entry is not None:
        return _saw(made, entry.value)
    read: Read = yield call("read", made, scope=leases.scope(config))
    if read.found:
        return _saw(made, read.value)
    seen = _seen.get(made)
    if read.lease is not None and read.lease.without_redis and seen is not None:
        # Redis is away: the list seen last leads every request of this
        # process to the page's key, whose one lease decides who renders it
        # (rendering for the header list too would be a second render).
        # Committed: the requests that came meanwhile wait for it.
        leases.take(config, made)
        yield call("commit", read.lease, seen)
        return seen
    return default


def write_header(
    config: CacheConfig, options: Options, made: str, value: Any, ttl: int | None, lease: Lease | None
) -> Plan[bool]:
    """``set`` of a header list: with this request's lease on it, deferred
    until its page is stored (see :func:`commit_deferred`), so that requests
    woken by the list find the page too; without, stored now. Whether it was
    deferred."""
    stale_ttl = _stale_ttl(options)
    _saw(made, value)
    if lease is not None:
        leases.defer(config, lease, value, ttl, stale_ttl)
        return True
    yield call("set", made, value, ttl=ttl, stale_ttl=stale_ttl)
    return False


def commit_deferred(config: CacheConfig) -> Plan[None]:
    """Commit the header lists this request deferred: its page is stored."""
    for lease, value, ttl, stale_ttl in leases.take_deferred(config):
        yield call("commit", lease, value, ttl=ttl, stale_ttl=stale_ttl, store_if_lapsed=True)


def _stale_ttl(options: Options) -> float:
    """How long a header list is kept past its timeout: past its page's
    (``STALE_TTL``) and that page's next render (``MAX_LEASE_TIME`` at
    most). A header list outlives its page, so that the requests that
    find the page gone read the page's key, whose one lease decides who
    renders it; were the header list gone too, the request that took its
    lease would render the page beside the one holding the page's."""
    return options.stale_ttl + options.max_lease_time
