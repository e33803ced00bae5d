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
:class:`~stampede.ConfigurationError` that names the URL. A connection
keyword the client or its connections do not take is an
:class:`~stampede.UnknownOptionError` that names the keyword.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.backoff
import redis.cluster
import redis.retry
import redis.sentinel

from .._core.options import Options
from .._exceptions import ConfigurationError, UnknownOptionError

__all__ = [
    "Target",
    "check_connection_options",
    "connect",
    "parse_url",
    "redact",
    "redis_url_kind",
    "split_options",
]

#: What a URL names: one server, a Redis Cluster, or a Sentinel-watched service.
Kind = Literal["server", "cluster", "sentinel"]
#: The schemes of the URLs stampede connects to: what each names, and whether it is TLS.
_SCHEMES: dict[str, tuple[Kind, bool]] = {
    "redis": ("server", False),
    "rediss": ("server", True),
    "unix": ("server", False),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}
_SENTINEL_PORT = 26379


def _scheme(url: object) -> tuple[Kind, bool] | None:
    """What ``url``'s scheme names and whether it is TLS; ``None``: not a scheme stampede connects to."""
    if not isinstance(url, str) or "://" not in url:
        return None
    return _SCHEMES.get(url.split("://", 1)[0].lower())


def redis_url_kind(url: object) -> Kind | None:
    """What a Redis URL names, by its scheme: ``"server"`` (``redis://``,
    ``rediss://``, ``unix://``), ``"cluster"`` (``redis+cluster://``,
    ``rediss+cluster://``) or ``"sentinel"`` (``redis+sentinel://``,
    ``rediss+sentinel://``); ``None`` for anything else, a string or not.
    Only the scheme is read (in any case, as redis-py reads it): the rest
    of the URL is checked when a client is made for it.

    >>> stampede.redis_url_kind("rediss+cluster://node1:7000,node2:7000")
    'cluster'
    """
    scheme = _scheme(url)
    return None if scheme is None else scheme[0]


@dataclass(frozen=True)
class Target:
    """Where to connect. ``url``: what redis-py's ``from_url`` takes (one server,
    or a cluster node); the other fields are a Sentinel service's."""

    kind: Kind
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
        raise ConfigurationError(
            f"url must be a Redis URL such as redis://host:6379/0, got {redact(url)!r}", field="url"
        )
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if scheme not in _SCHEMES:
        raise ConfigurationError(
            f"url: {scheme}:// is not a Redis URL scheme; use one of "
            f"{', '.join(name + '://' for name in _SCHEMES)}, got {redact(url)!r}",
            field="url",
        )
    kind, tls = _SCHEMES[scheme]
    if kind == "sentinel":
        return _sentinel(url, rest, ssl=tls)
    if kind == "server" and not cluster:
        return Target("server", url)
    path = rest.split("?", 1)[0].split("/", 1)
    if len(path) == 2 and path[1] not in ("", "0"):
        raise ConfigurationError(
            f"a Redis Cluster has only database 0; the url names {path[1]!r}: {redact(url)!r}", field="url"
        )
    # More startup nodes, comma-separated: any of them that answers will do.
    location, tail = path[0], rest[len(path[0]) :]
    credentials, at, hosts = location.rpartition("@")
    first, *others = hosts.split(",")
    nodes = []
    for address in others:
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(
                f"a cluster node in {redact(url)!r} must be host:port, got {address!r}", field="url"
            )
        nodes.append((host, int(port)))
    plain = scheme.removesuffix("+cluster")  # a node's, as redis-py reads it
    return Target("cluster", f"{plain}://{credentials}{at}{first}{tail}", sentinels=tuple(nodes))


def _sentinel(url: str, rest: str, *, ssl: bool) -> Target:
    if "?" in rest:
        raise ConfigurationError(f"a redis+sentinel:// url takes no query: {redact(url)!r}", field="url")
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
            f"redis+sentinel://host:26379/mymaster/0, got {redact(url)!r}",
            field="url",
        )
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise ConfigurationError(
                f"the database in {redact(url)!r} must be a number, got {parts[1]!r}", field="url"
            )
        db = int(parts[1])
    sentinels = []
    for address in hosts.split(","):
        host, has_port, port = address.rpartition(":") if ":" in address else (address, "", "")
        if not host or (has_port and not port.isdigit()):
            raise ConfigurationError(
                f"a Sentinel address in {redact(url)!r} must be host[:port], got {address!r}", field="url"
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
    made for it (a Sentinel's), to close with it. Connects lazily, as redis-py
    does. A keyword the client class does not take (the asyncio cluster
    client's refuses some of the server client's) is an
    :class:`~stampede.UnknownOptionError` naming it."""
    target = parse_url(url, cluster=cluster)
    try:
        return _connect(target, asynchronous, options)
    except TypeError as exc:
        name = _unexpected_keyword(exc)
        if name is None:
            raise
        server, cluster_class, _ = _CLASSES[asynchronous]
        client_class = cluster_class if target.kind == "cluster" else server
        raise UnknownOptionError(
            f"{name} is not taken by {client_class.__name__}, the redis-py client class for {redact(url)!r}",
            field=name,
        ) from None


def _connect(target: Target, asynchronous: bool, options: dict[str, Any]) -> tuple[Any, list[Any]]:
    server, cluster_class, sentinel_class = _CLASSES[asynchronous]
    if target.kind == "sentinel":
        timeouts = {k: v for k, v in options.items() if k in ("socket_timeout", "socket_connect_timeout")}
        # Asked one after the other, the Sentinels are tried once each: redis-py's
        # default retries (ten, backing off up to a second) made a call with
        # every Sentinel down take about 15 s before it could fail.
        retry_class = redis.asyncio.retry.Retry if asynchronous else redis.retry.Retry
        sentinel_kwargs = {**timeouts, "retry": retry_class(redis.backoff.NoBackoff(), 0)}
        sentinel = sentinel_class(list(target.sentinels), sentinel_kwargs=sentinel_kwargs, **timeouts)
        # The URL's database, scheme and credentials win over keywords, as in redis-py's from_url.
        settings = {**options, "db": target.db, "ssl": target.ssl}
        if target.username is not None:
            settings["username"] = target.username
        if target.password is not None:
            settings["password"] = target.password
        master = sentinel.master_for(target.service, **settings)
        return master, list(sentinel.sentinels)
    if target.kind == "cluster":
        options.pop("health_check_interval", None)  # a cluster client checks its nodes itself
        if target.sentinels:
            node_class = redis.asyncio.cluster.ClusterNode if asynchronous else redis.cluster.ClusterNode
            options["startup_nodes"] = [node_class(host, port) for host, port in target.sentinels]
        return cluster_class.from_url(target.url, **options), []
    return server.from_url(target.url, **options), []


#: What Python says of a keyword argument a function does not take.
_UNEXPECTED_KEYWORD = re.compile(r"unexpected keyword argument '(\w+)'")


def _unexpected_keyword(exc: TypeError) -> str | None:
    """The keyword ``exc`` says a function did not take, if that is what it says."""
    found = _UNEXPECTED_KEYWORD.search(str(exc))
    return found.group(1) if found else None


def check_connection_options(client: Any, url: str) -> None:
    """Refuse now a connection keyword that the connections of ``client`` (a
    redis-py client made for ``url``) do not take: redis-py keeps the
    keywords a pool is given and passes them to its connection class only
    when it makes a connection, at the first command, where one that class
    does not take would be a bare ``TypeError``. Makes a connection, and
    connects nothing.

    Raises :class:`~stampede.UnknownOptionError` whose ``field`` is the
    keyword (``ssl_ca_certs`` with a ``redis://`` URL: the message says to
    use ``rediss://``); any other ``TypeError`` of the connection class as it
    is. A client without a pool of its own (a cluster's, whose nodes have
    theirs) is left unchecked.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return
    try:
        pool.connection_class(**pool.connection_kwargs)
    except TypeError as exc:
        name = _unexpected_keyword(exc)
        if name is None:
            raise
        tls = name.startswith("ssl_") and not _is_tls(url)
        raise UnknownOptionError(
            f"{name} is not taken by {pool.connection_class.__name__}, the connection class for "
            f"{redact(url)!r}" + ("; ssl_* options configure TLS: use a rediss:// URL" if tls else ""),
            field=name,
        ) from None


#: redis-py keywords that the URL gives instead, and what to write there.
_GIVEN_BY_THE_URL = {
    "host": "the URL's host",
    "port": "the URL's port",
    "path": "a unix:// URL",
    "unix_socket_path": "a unix:// URL",
    "ssl": "a rediss:// URL",
    "connection_pool": "the URL (from_url makes the pool)",
    "url": "the URL",
    "startup_nodes": "the URL (redis+cluster://host:port,host:port)",
}


def _is_tls(url: str) -> bool:
    """Whether ``url``'s scheme asks for TLS (``rediss://``, ``rediss+cluster://``...)."""
    scheme = _scheme(url)
    return scheme is not None and scheme[1]


@functools.cache
def _redis_keywords(asynchronous: bool, cluster: bool) -> frozenset[str]:
    """The keywords of redis-py's client class (and of its cluster class),
    which its ``from_url`` passes on to the connections: ``ssl_ca_certs``,
    ``ssl_certfile``, ``retry``, ``client_name``..."""
    server, cluster_class, _ = _CLASSES[asynchronous]
    names = {"connection_class", "parser_class"}  # the connection pool's, as in ConnectionPool.from_url
    for cls in (server, cluster_class) if cluster else (server,):
        names.update(
            name
            for name, parameter in inspect.signature(cls.__init__).parameters.items()
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        )
    return frozenset(names - {"self"} - _GIVEN_BY_THE_URL.keys())


def _own_keywords(owner: type) -> frozenset[str]:
    """What ``owner``'s constructor takes by name: its keywords and those of
    the classes it extends, and the fields of :class:`~stampede.Options`."""
    names = {field.name for field in dataclasses.fields(Options)}
    for cls in owner.__mro__:
        init = cls.__dict__.get("__init__")
        if init is not None and cls is not object:
            names.update(
                name
                for name, parameter in inspect.signature(init).parameters.items()
                if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
            )
    return frozenset(names - {"self", "client"})


def split_options(
    owner: type, url: str, keywords: dict[str, Any], *, asynchronous: bool, cluster: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``from_url``'s keywords, split: redis-py's connection keywords
    (``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``,
    ``retry``...) for the client, and ``owner``'s own (``namespace``,
    ``ttl``...) for its constructor. One that neither takes, or an ``ssl_*``
    keyword with a URL that is not TLS, is a :class:`ConfigurationError`
    naming it."""
    own = _own_keywords(owner)
    target = parse_url(url, cluster=cluster)
    known = _redis_keywords(asynchronous, target.kind == "cluster")
    unknown = sorted(name for name in keywords if name not in own and name not in known)
    if unknown:
        hints = []
        for name in unknown:
            if name in _GIVEN_BY_THE_URL:
                hints.append(f"{name} is given by {_GIVEN_BY_THE_URL[name]}")
            else:
                close = difflib.get_close_matches(name, sorted(own | known), n=1)
                if close:
                    hints.append(f"did you mean {close[0]}?")
        raise ConfigurationError(
            f"{owner.__name__}.from_url() got unknown keyword(s) {', '.join(unknown)}: neither a "
            f"stampede option ({', '.join(sorted(own))}) nor a redis-py connection keyword "
            f"(those of {'redis.asyncio' if asynchronous else 'redis'}.Redis)"
            + (f"; {'; '.join(hints)}" if hints else ""),
            field=unknown[0],
        )
    tls = sorted(name for name in keywords if name.startswith("ssl_") and name not in own)
    if tls and not _is_tls(url):
        raise ConfigurationError(
            f"{', '.join(tls)} configure TLS, which a {url.split('://', 1)[0]}:// URL does not use: "
            f"use rediss:// (or rediss+cluster://, rediss+sentinel://), got {redact(url)!r}",
            field=tls[0],
        )
    redis_options = {name: value for name, value in keywords.items() if name not in own}
    return redis_options, {name: value for name, value in keywords.items() if name in own}
