"""What a Redis URL names (one server, a Redis Cluster, or a service that
Sentinels watch), and the redis-py client for it, blocking or asyncio.

- ``redis://``, ``rediss://``, ``unix://``: one server, as redis-py reads it.
- ``redis+cluster://host:port[,host:port...]`` (``rediss+cluster://``): a
  Redis Cluster, by any of its nodes (the first that answers); database 0 only.
- ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``
  (``rediss+sentinel://``: TLS to the servers): the master of ``service``, as
  the Sentinels at those addresses report it (port 26379 if left out). The
  user and password are the servers'.

So a URL alone (``STAMPEDE_REDIS_URL``) can say which, and a mistake is a
:class:`~stampede.ConfigurationError` that names the URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel

from ._exceptions import ConfigurationError

__all__ = ["Target", "connect", "parse_url", "redact"]

_CLUSTER = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_SENTINEL = {"redis+sentinel": False, "rediss+sentinel": True}
_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class Target:
    """Where to connect. ``url``: what redis-py's ``from_url`` takes (one server,
    or a cluster node); the other fields are a Sentinel service's."""

    kind: Literal["server", "cluster", "sentinel"]
    url: str = ""
    #: The Sentinels' addresses; for a cluster, its startup nodes besides ``url``'s.
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False


_PASSWORD_IN_NETLOC = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:@/]*):[^/]*@")
_PASSWORD_IN_QUERY = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def redact(url: object) -> str:
    """``url`` fit to print: its password, in the authority or the query,
    replaced by ``***`` (as redis-py and SQLAlchemy show URLs). Anything
    that is not a string is shown as its ``repr``."""
    if not isinstance(url, str):
        return repr(url)
    return _PASSWORD_IN_QUERY.sub(r"\1***", _PASSWORD_IN_NETLOC.sub(r"\1:***@", url))


def parse_url(url: str, *, cluster: bool = False) -> Target:
    """The :class:`Target` of ``url``; ``cluster=True`` reads a plain URL as a cluster node's."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(f"url must be a Redis URL such as redis://host:6379/0, got {redact(url)!r}")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if scheme in _SENTINEL:
        return _sentinel(url, rest, ssl=_SENTINEL[scheme])
    plain = _CLUSTER.get(scheme)
    if plain is None and not cluster:
        return Target("server", url)
    path = rest.split("?", 1)[0].split("/", 1)
    if len(path) == 2 and path[1] not in ("", "0"):
        raise ConfigurationError(
            f"a Redis Cluster has only database 0; the url names {path[1]!r}: {redact(url)!r}"
        )
    # More startup nodes, comma-separated: any of them that answers will do.
    location, tail = path[0], rest[len(path[0]) :]
    credentials, at, hosts = location.rpartition("@")
    first, *others = hosts.split(",")
    nodes = []
    for address in others:
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(f"a cluster node in {redact(url)!r} must be host:port, got {address!r}")
        nodes.append((host, int(port)))
    return Target("cluster", f"{plain or scheme}://{credentials}{at}{first}{tail}", sentinels=tuple(nodes))


def _sentinel(url: str, rest: str, *, ssl: bool) -> Target:
    if "?" in rest:
        raise ConfigurationError(f"a redis+sentinel:// url takes no query: {redact(url)!r}")
    credentials, _, location = rest.rpartition("@")
    username = password = None
    if credentials:
        user, has_password, secret = credentials.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if has_password else None
    hosts, _, path = location.partition("/")
    parts = [part for part in path.split("/") if part]
    if not parts or len(parts) > 2:
        raise ConfigurationError(
            f"a redis+sentinel:// url names the service, and a database if any: "
            f"redis+sentinel://host:26379/mymaster/0, got {redact(url)!r}"
        )
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise ConfigurationError(f"the database in {redact(url)!r} must be a number, got {parts[1]!r}")
        db = int(parts[1])
    sentinels = []
    for address in hosts.split(","):
        host, has_port, port = address.rpartition(":") if ":" in address else (address, "", "")
        if not host or (has_port and not port.isdigit()):
            raise ConfigurationError(
                f"a Sentinel address in {redact(url)!r} must be host[:port], got {address!r}"
            )
        sentinels.append((host, int(port) if port else _SENTINEL_PORT))
    return Target(
        "sentinel",
        sentinels=tuple(sentinels),
        service=parts[0],
        db=db,
        username=username,
        password=password,
        ssl=ssl,
    )


#: redis-py's server, cluster and Sentinel classes: blocking, and asyncio.
_CLASSES: dict[bool, tuple[Any, Any, Any]] = {
    False: (redis.Redis, redis.cluster.RedisCluster, redis.sentinel.Sentinel),
    True: (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster, redis.asyncio.sentinel.Sentinel),
}


def connect(url: str, *, asynchronous: bool, cluster: bool = False, **options: Any) -> tuple[Any, list[Any]]:
    """The client for ``url`` (``options`` go to redis-py), and the other clients
    made for it (a Sentinel's), to close with it. Connects lazily, as redis-py does."""
    server, cluster_class, sentinel_class = _CLASSES[asynchronous]
    target = parse_url(url, cluster=cluster)
    if target.kind == "sentinel":
        timeouts = {k: v for k, v in options.items() if k in ("socket_timeout", "socket_connect_timeout")}
        sentinel = sentinel_class(list(target.sentinels), **timeouts)
        master = sentinel.master_for(
            target.service,
            db=target.db,
            username=target.username,
            password=target.password,
            ssl=target.ssl,
            **options,
        )
        return master, list(sentinel.sentinels)
    if target.kind == "cluster":
        options.pop("health_check_interval", None)  # a cluster client checks its nodes itself
        if target.sentinels:
            node_class = redis.asyncio.cluster.ClusterNode if asynchronous else redis.cluster.ClusterNode
            options["startup_nodes"] = [node_class(host, port) for host, port in target.sentinels]
        return cluster_class.from_url(target.url, **options), []
    return server.from_url(target.url, **options), []
