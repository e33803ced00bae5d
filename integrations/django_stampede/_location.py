"""A ``CACHES`` entry's ``LOCATION``: the Redis URLs of the cache, checked."""

from __future__ import annotations

import re
from typing import Any

import stampede

from ._errors import bad, shown

__all__ = ["sentinel_location", "servers_of"]


def servers_of(location: Any) -> tuple[str, ...]:
    """The URLs ``LOCATION`` names: one, several (a list, or a string split on
    commas or semicolons: a primary and its replicas), or one cluster or
    Sentinel URL (see stampede.Stampede.from_url), never split on commas."""
    if isinstance(location, str) and stampede.redis_url_kind(location.strip()) in ("cluster", "sentinel"):
        servers = [location.strip()]
    elif isinstance(location, str):
        servers = [part.strip() for part in re.split("[;,]", location) if part.strip()]
    elif isinstance(location, (list, tuple)) and all(isinstance(part, str) for part in location):
        servers = list(location)
    else:
        raise bad("LOCATION", f"must be a Redis URL or a list of them, got {shown(location)}")
    if not servers:
        raise bad("LOCATION", "names no Redis server")
    for url in servers:
        kind = stampede.redis_url_kind(url)
        if kind in ("cluster", "sentinel") and len(servers) > 1:
            raise bad("LOCATION", f"a cluster or Sentinel URL stands alone, got {shown(location)}")
        if kind is None:
            raise bad(
                "LOCATION",
                f"entry {shown(url)} is not a redis://, rediss://, unix://, "
                "redis+cluster:// or redis+sentinel:// URL",
            )
    return tuple(servers)


def sentinel_location(servers: tuple[str, ...], sentinels: Any) -> str:
    """django-redis's Sentinel convention (LOCATION ``redis://<service>/<db>``,
    OPTIONS ``SENTINELS``) as the ``redis+sentinel://`` URL it means."""
    try:
        addresses = [f"{host}:{int(port)}" for host, port in sentinels]
        if not addresses or not all(isinstance(host, str) and host for host, _ in sentinels):
            raise ValueError
    except (TypeError, ValueError):
        raise bad("OPTIONS['SENTINELS']", f"must be a list of (host, port), got {sentinels!r}") from None
    if len(servers) != 1 or not re.match(r"^rediss?://", servers[0]):
        raise bad(
            "LOCATION",
            f"with OPTIONS['SENTINELS'] must be one 'redis://<service>/<db>' URL, got {shown(servers)}",
        )
    scheme, rest = servers[0].split("://", 1)
    authority, _, path = rest.partition("/")
    credentials, at, service = authority.rpartition("@")
    if not service or ":" in service:
        raise bad(
            "LOCATION", f"with OPTIONS['SENTINELS'] names the service as its host, got {shown(servers[0])}"
        )
    db = path.split("?", 1)[0].strip("/") or "0"
    return f"{scheme}+sentinel://{credentials}{at}{','.join(addresses)}/{service}/{db}"
