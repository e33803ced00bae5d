"""Free loopback ports for test servers, kept outside the range clients' local ports come from."""

from __future__ import annotations

import os
import random
import socket
import tempfile
import threading

try:
    import fcntl
except ImportError:  # not on Windows: ports are then this process's alone
    fcntl = None  # type: ignore[assignment]


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
#: A file whose bytes stand for ports: this process locks byte ``port`` of it
#: (a POSIX record lock, held while the process lives, released by the kernel
#: however it ends) for each port it hands out, so other processes
#: (pytest-xdist's workers, another test run) never hand out the same port,
#: even while a server of ours is stopped for a restart.
_CLAIMS = os.path.join(tempfile.gettempdir(), "stampede-test-ports")
_claims_fd: int | None = None


def free_ports(count: int, *, bus: int = 0) -> list[int]:
    """``count`` free ports (with ``bus``: each ``port + bus`` free too, for a
    cluster's bus), outside the kernel's range for clients' local ports: a
    server's port stays its own across a restart, while any connection made
    meanwhile could otherwise be given it. No other process using this
    function is handed the same port while this one lives."""
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
            if not _claim(candidates):
                continue
            if all(_is_free(candidate) for candidate in candidates):
                _handed_out.update(candidates)
                ports.append(port)
            else:
                _release(candidates)
    if len(ports) < count:
        raise RuntimeError(f"no {count} free ports between {first} and {last}")
    return ports


def free_port() -> int:
    return free_ports(1)[0]


def _claim(ports: tuple[int, ...]) -> bool:
    """Claim ``ports`` for this process, all or none; ``False`` if another
    process holds one of them."""
    global _claims_fd
    if fcntl is None:
        return True
    if _claims_fd is None:
        try:
            _claims_fd = os.open(_CLAIMS, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:  # a file this user cannot write to: the bind check alone
            return True
    for i, port in enumerate(ports):
        try:
            fcntl.lockf(_claims_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
        except OSError:
            _release(ports[:i])
            return False
    return True


def _release(ports: tuple[int, ...]) -> None:
    if fcntl is not None and _claims_fd is not None:
        for port in ports:
            fcntl.lockf(_claims_fd, fcntl.LOCK_UN, 1, port)


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
