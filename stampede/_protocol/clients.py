"""The clients an instance reads through besides its own: what a client is, and
the replicas that may hold a copy of a key while its primary fails."""

from __future__ import annotations

import inspect
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel

from .._exceptions import ConfigurationError
from .nodes import node_client

__all__ = ["Standbys", "check_client", "is_cluster", "sentinel_failure", "sentinel_pool"]


#: The connection settings a Sentinel-managed master's replicas are read with.
_CONNECTION_SETTINGS = (
    "db",
    "username",
    "password",
    "credential_provider",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "retry_on_timeout",
    "health_check_interval",
    "client_name",
    *(f"ssl_{name}" for name in ("keyfile", "certfile", "cert_reqs", "ca_certs", "ca_data", "ca_path")),
    *(f"ssl_{name}" for name in ("check_hostname", "password", "min_version", "ciphers")),
)


def sentinel_pool(client: Any) -> Any:
    """The Sentinel-managed pool of ``client`` (a master), or ``None``."""
    pool = getattr(client, "connection_pool", None)
    kinds = (redis.sentinel.SentinelConnectionPool, redis.asyncio.sentinel.SentinelConnectionPool)
    return pool if isinstance(pool, kinds) and pool.is_master else None


#: redis-py's client classes, asyncio and blocking.
_ASYNCIO_CLIENTS = (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)
_BLOCKING_CLIENTS = (redis.Redis, redis.cluster.RedisCluster)


def _is_asyncio(client: object) -> bool:
    """Whether ``client`` is a ``redis.asyncio`` client: one of its classes (a
    Sentinel's master or replica included), or, for a client that only looks
    like one (a wrapper, a proxy), one whose ``execute_command`` is a coroutine function."""
    if isinstance(client, _ASYNCIO_CLIENTS):
        return True
    if isinstance(client, _BLOCKING_CLIENTS):
        return False
    return inspect.iscoroutinefunction(getattr(client, "execute_command", None))


def check_client(client: object, *, asynchronous: bool, argument: str = "client") -> None:
    """Refuse what is not a redis-py client of the flavour of the instance
    (``asynchronous``: ``stampede.asyncio``'s), or one that decodes responses;
    ``argument``: how the caller named it (``"replicas[0]"``: the error's
    ``field`` is ``"replicas"``)."""
    field = argument.partition("[")[0]
    kwargs_of = getattr(client, "get_connection_kwargs", None)
    if kwargs_of is None:
        raise ConfigurationError(
            f"{argument} must be a redis-py client, got {type(client).__name__}", field=field
        )
    if _is_asyncio(client) != asynchronous:
        kind = type(client).__name__
        if asynchronous:
            raise ConfigurationError(
                f"{argument} is a blocking redis-py client ({kind}), and stampede.asyncio.Stampede "
                f"awaits its commands: use stampede.Stampede for blocking clients, or give "
                f"stampede.asyncio.Stampede a redis.asyncio client (redis.asyncio.Redis, "
                f"redis.asyncio.RedisCluster)",
                field=field,
            )
        raise ConfigurationError(
            f"{argument} is a redis.asyncio client ({kind}), and stampede.Stampede blocks on its "
            f"commands: use stampede.asyncio.Stampede for redis.asyncio clients, or give "
            f"stampede.Stampede a blocking client (redis.Redis, redis.cluster.RedisCluster)",
            field=field,
        )
    if kwargs_of().get("decode_responses"):
        raise ConfigurationError(
            f"{argument} has decode_responses=True; stampede stores binary envelopes "
            "and needs a client created with decode_responses=False",
            field=field,
        )


_NO_MASTER = (redis.sentinel.MasterNotFoundError, redis.asyncio.sentinel.MasterNotFoundError)


def sentinel_failure(client: Any, exc: BaseException) -> str | None:
    """What a failure of the Sentinels of ``client`` (a Sentinel-managed
    master) to name its master comes to, in a line: their addresses, the
    service, what failed and what to check. redis-py's own message embeds
    the repr of every Sentinel client it asked, a page long. ``None`` for
    any other failure."""
    pool = sentinel_pool(client)
    if pool is None or not isinstance(exc, _NO_MASTER):
        return None
    sentinels = list(getattr(pool.sentinel_manager, "sentinels", ()))
    addresses = []
    for sentinel in sentinels:
        kwargs = getattr(getattr(sentinel, "connection_pool", None), "connection_kwargs", {})
        addresses.append(kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}")
    # redis-py lists the Sentinels it could not reach after " : ", each as
    # "<client repr> - <error>"; those that answered did not know the service.
    text = str(exc)
    unreachable = text.partition(" : ")[2].count("> - ") if " : " in text else 0
    if unreachable and unreachable >= len(sentinels):
        what = "none of them could be reached"
    elif unreachable:
        what = (
            f"{unreachable} of them could not be reached, and those that answered know no master "
            "of that name that is up"
        )
    else:
        what = "they answered, and none knows a master of that name that is up"
    return (
        f"no master for service {pool.service_name!r} from the Sentinels at {', '.join(addresses)}: "
        f"{what}; check the Sentinel addresses (and that they run) and the service name (the "
        "name of their `sentinel monitor` line), as in redis+sentinel://host:26379/service"
    )


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a Redis Cluster client (blocking or asyncio)."""
    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))


def fails_over(client: Any) -> bool:
    """Whether the primary ``client`` talks to is replaced when it fails (a
    Redis Cluster, a Sentinel-watched master) rather than gone."""
    return is_cluster(client) or sentinel_pool(client) is not None


class Standbys:
    """The clients that may hold a copy of a key when its primary fails: the
    replicas given, a cluster node's replicas, or a Sentinel-watched
    master's replicas. Clients made here (node clients, a Sentinel's replica
    client) are made once, when first needed, and closed with the instance."""

    def __init__(self, client: Any, replicas: tuple[Any, ...]) -> None:
        self._client = client
        self._cluster = is_cluster(client)
        self._sentinel_pool = sentinel_pool(client)
        self._replicas = replicas
        self._made: dict[str, Any] = {}

    @property
    def fail_over(self) -> bool:
        """Whether a failed primary is replaced (a failover) rather than gone."""
        return self._cluster or self._sentinel_pool is not None

    def made(self) -> list[Any]:
        """The clients made so far."""
        return list(self._made.values())

    def take_made(self) -> list[Any]:
        """The clients made so far, forgotten here: the caller closes them."""
        made = list(self._made.values())
        self._made.clear()
        return made

    def for_key(self, name: bytes) -> list[tuple[Any, bool]]:
        """The clients that may hold a copy of ``name`` when its primary fails,
        each with whether it needs READONLY first (a cluster replica)."""
        if self._cluster:
            client = self._client
            nodes = client.nodes_manager.slots_cache.get(client.keyslot(name)) or ()
            return [(self._node_client(node), True) for node in nodes[1:]]
        pool = self._sentinel_pool
        if pool is not None:
            standby = self._made.get("sentinel")
            if standby is None:
                # Connects lazily: a client made by a thread that loses the
                # race below holds no socket.
                kwargs = pool.connection_kwargs
                standby = self._made.setdefault(
                    "sentinel",
                    pool.sentinel_manager.slave_for(
                        pool.service_name,
                        connection_class=pool.connection_class,
                        **{key: kwargs[key] for key in _CONNECTION_SETTINGS if key in kwargs},
                    ),
                )
            return [(standby, False)]
        return [(replica, False) for replica in self._replicas]

    def _node_client(self, node: Any) -> Any:
        """This instance's client of one cluster node, made once, closed with it."""
        client = self._made.get(node.name)
        if client is None:
            made = node_client(self._client, node)
            client = self._made.setdefault(node.name, made)  # atomic: one per node
            if client is not made:  # another thread's came first (blocking clients only)
                made.close()
        return client
