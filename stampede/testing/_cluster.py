"""A local Redis Cluster, and one slot migrated the way `redis-cli --cluster reshard` does it."""

from __future__ import annotations

import functools

import redis
from redis.crc import key_slot

from ._ports import free_ports
from ._redis_servers import RedisServer
from ._server_sets import ServerSet, command, replicated, text, wait_for


class RedisCluster(ServerSet):
    """A local Redis Cluster of :class:`RedisServer` nodes: ``masters`` masters,
    each with ``replicas`` replicas, every slot assigned, all in sync.

    >>> with RedisCluster() as cluster:
    ...     sf = stampede.Stampede.from_url(cluster.url)  # redis+cluster://
    ...     client = redis.cluster.RedisCluster.from_url(cluster.node_url)  # redis-py's own

    ``binary`` as for :class:`RedisServer` (Valkey's serves too, with
    sharded pub/sub). ``node_timeout_ms``: how soon a failed master's
    replica takes over (``cluster-node-timeout``).
    """

    def __init__(
        self, masters: int = 3, replicas: int = 1, *, binary: str | None = None, node_timeout_ms: int = 1000
    ) -> None:
        args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(node_timeout_ms),
        ]
        self.masters = masters
        count = masters * (1 + replicas)
        self.nodes = [RedisServer(port, args=args, binary=binary) for port in _cluster_ports(count)]

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL of the cluster, every node named (any
        that answers will do), as :meth:`stampede.Stampede.from_url` and the
        framework settings take it."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    @property
    def node_url(self) -> str:
        """The ``redis://`` URL of one node, for redis-py's own
        ``RedisCluster.from_url`` (cluster clients find the others from it).
        Not for a plain client: the other nodes' keys answer ``MOVED``."""
        return self.nodes[0].url

    def start(self, timeout: float = 30.0) -> RedisCluster:
        """Start every node, join them, assign the slots, attach the replicas,
        and wait until every node reports the cluster ok and every replica in sync."""
        clients: list[redis.Redis] = []
        try:
            for node in self.nodes:
                node.start()
            clients = [redis.Redis(port=node.port, socket_timeout=5) for node in self.nodes]
            for node in self.nodes[1:]:
                command(clients[0], "CLUSTER MEET", "127.0.0.1", node.port)
            share = 16384 // self.masters
            for i in range(self.masters):
                last = 16383 if i == self.masters - 1 else (i + 1) * share - 1
                command(clients[i], "CLUSTER ADDSLOTS", *range(i * share, last + 1))
            ids = [text(command(client, "CLUSTER MYID")) for client in clients]
            wait_for(lambda: all(_known_nodes(client) == len(clients) for client in clients), timeout)
            for j, client in enumerate(clients[self.masters :]):
                master_id = ids[j % self.masters]
                # A node counted as known may still be in handshake under
                # another id: "Unknown node" until gossip settles.
                wait_for(functools.partial(_replicate, client, master_id), timeout)
            wait_for(lambda: all(_cluster_ok(client) for client in clients), timeout)
            wait_for(
                lambda: all(
                    client.info("replication").get("master_link_status") == "up"
                    for client in clients[self.masters :]
                ),
                timeout,
            )
            # A write on every master: Valkey lists a replica in CLUSTER SLOTS
            # (where clients find replicas) only once it has replicated something.
            for i, client in enumerate(clients[: self.masters]):
                key = next(
                    key
                    for n in range(1_000_000)
                    if i * share <= key_slot(key := f"stampede-testing-{n}".encode()) < (i + 1) * share
                )
                client.set(key, b"1")
            if len(clients) > self.masters:  # with replicas=0, nothing to wait for
                wait_for(lambda: all(replicated(client) for client in clients[: self.masters]), timeout)
        except BaseException:
            self.stop()
            raise
        finally:
            for client in clients:
                client.close()
        return self

    def begin_migration(self, key: bytes | str, to: RedisServer | None = None) -> SlotMigration:
        """Start moving ``key``'s slot to another master (``to``, or the next one):
        both masters are left half-way (``MIGRATING`` / ``IMPORTING``), no key
        moved yet; the returned :class:`SlotMigration` moves them and finishes."""
        source = self.master_of(key)
        masters = [node for node in self.nodes if node.running and self._is_master(node)]
        target = to or masters[(masters.index(source) + 1) % len(masters)]
        with redis.Redis(port=source.port, socket_timeout=5) as client:
            slot = int(command(client, "CLUSTER KEYSLOT", key))
        migration = SlotMigration(slot, source, target, masters)
        migration.start()
        return migration

    @staticmethod
    def _is_master(node: RedisServer) -> bool:
        with redis.Redis(port=node.port, socket_timeout=5) as client:
            return bool(client.info("replication")["role"] == "master")

    def master_of(self, key: bytes | str) -> RedisServer:
        """The node that masters ``key``'s slot now, as the running nodes see it
        (after a failover: the promoted replica)."""
        for node in self.nodes:
            if not node.running:
                continue
            with redis.Redis(port=node.port, socket_timeout=5) as client:
                slot = int(command(client, "CLUSTER KEYSLOT", key))
                for first, last, master, *_ in command(client, "CLUSTER SLOTS"):
                    if first <= slot <= last:
                        port = int(master[1])
                        return next(server for server in self.nodes if server.port == port)
        raise RuntimeError(f"no running node knows the master of {key!r}")

    def _servers(self) -> list[RedisServer]:
        return self.nodes

    def _masters(self) -> list[RedisServer]:
        return [node for node in self.nodes[: self.masters] if node.running]


class SlotMigration:
    """One slot on its way from ``source`` to ``target``, as ``redis-cli --cluster
    reshard`` moves it: :meth:`start`, :meth:`move_keys`, :meth:`finish`."""

    def __init__(
        self, slot: int, source: RedisServer, target: RedisServer, masters: list[RedisServer]
    ) -> None:
        self.slot = slot
        self.source = source
        self.target = target
        self._masters = masters

    @staticmethod
    def _id(node: RedisServer) -> str:
        with redis.Redis(port=node.port, socket_timeout=5) as client:
            return text(command(client, "CLUSTER MYID"))

    def start(self) -> None:
        """Mark the slot importing on the target and migrating on the source."""
        with redis.Redis(port=self.target.port, socket_timeout=5) as client:
            command(client, "CLUSTER SETSLOT", self.slot, "IMPORTING", self._id(self.source))
        with redis.Redis(port=self.source.port, socket_timeout=5) as client:
            command(client, "CLUSTER SETSLOT", self.slot, "MIGRATING", self._id(self.target))

    def move_keys(self) -> int:
        """Move every key of the slot still on the source; how many moved."""
        moved = 0
        with redis.Redis(port=self.source.port, socket_timeout=5) as client:
            while keys := command(client, "CLUSTER GETKEYSINSLOT", self.slot, 100):
                command(client, "MIGRATE", "127.0.0.1", self.target.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
        return moved

    def finish(self) -> None:
        """Move what is left and give the slot to the target, on every master."""
        self.move_keys()
        target_id = self._id(self.target)
        for node in [self.target, self.source, *self._masters]:
            with redis.Redis(port=node.port, socket_timeout=5) as client:
                command(client, "CLUSTER SETSLOT", self.slot, "NODE", target_id)


def _cluster_ports(count: int) -> list[int]:
    """Free ports whose cluster bus ports (the port + 10000) are free too."""
    return free_ports(count, bus=10000)


def _known_nodes(client: redis.Redis) -> int:
    nodes = command(client, "CLUSTER NODES")
    # redis-py parses the reply into a dict of nodes; older versions give the text.
    return len(nodes) if isinstance(nodes, dict) else len(text(nodes).strip().splitlines())


def _cluster_ok(client: redis.Redis) -> bool:
    info = command(client, "CLUSTER INFO")
    state = info.get("cluster_state") if isinstance(info, dict) else None
    return state == "ok" or (state is None and "cluster_state:ok" in text(info))


def _replicate(client: redis.Redis, master_id: str) -> bool:
    """``CLUSTER REPLICATE``; ``False`` while the node does not know the master yet."""
    try:
        command(client, "CLUSTER REPLICATE", master_id)
    except redis.ResponseError as exc:
        if "Unknown node" in str(exc):
            return False
        raise
    return True
