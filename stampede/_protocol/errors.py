"""redis-py's errors as stampede reports them: the server's own words, a
misconfiguration told from an outage, and a connection torn down under a
command told from a bug."""

from __future__ import annotations

import os
import re
from typing import Any

import redis.exceptions

from .._exceptions import ConfigurationError, RedisUnavailableError, StampedeError
from .clients import sentinel_failure

__all__ = [
    "FAILURES",
    "Skipped",
    "error_code",
    "failure_of",
    "is_outage",
    "lost_connection",
    "misconfiguration",
    "server_words",
    "translated",
]


class Skipped(redis.exceptions.ConnectionError):
    """A command not sent: the server was found unreachable moments ago (its
    circuit breaker is open). Raised where redis-py's own would be, so that it
    is translated and handled as they are."""

    def __init__(self, cause: BaseException | None, retry_in: float) -> None:
        why = f" ({server_words(cause)})" if cause is not None else ""
        super().__init__(f"not sent: Redis was unreachable moments ago{why}; next try in {retry_in:.2f}s")
        self.cause = cause


#: The error codes redis-py takes off the replies it turns into these classes.
_ERROR_CODES = {
    redis.exceptions.MovedError: "MOVED",
    redis.exceptions.AskError: "ASK",
    redis.exceptions.TryAgainError: "TRYAGAIN",
    redis.exceptions.ClusterDownError: "CLUSTERDOWN",
    redis.exceptions.ReadOnlyError: "READONLY",
    redis.exceptions.NoPermissionError: "NOPERM",
    redis.exceptions.MasterDownError: "MASTERDOWN",
    redis.exceptions.BusyLoadingError: "LOADING",
    redis.exceptions.OutOfMemoryError: "OOM",
    redis.exceptions.NoScriptError: "NOSCRIPT",
}


#: Words of errors that carry no code of their own, and the code they mean.
_WORDED_CODES = (
    ("max number of clients", "MAXCLIENTS"),
    ("invalid bulk length", "TOO_LARGE"),
)


def error_code(exc: BaseException) -> str | None:
    """What kind of failure ``exc`` is, as :attr:`RedisUnavailableError.code`
    says: the server's error code if it answered (found in a script's error
    too: ``-OOM command not allowed...``), ``"TIMEOUT"`` or ``"CONNECTION"``
    if it did not."""
    if isinstance(exc, Skipped):
        return error_code(exc.cause) if exc.cause is not None else "CONNECTION"
    if isinstance(exc, redis.exceptions.MaxConnectionsError):
        return "POOL"
    words = server_words(exc)
    for sign, code in _WORDED_CODES:
        if sign in words:
            return code
    first = words.split(" ", 1)[0].lstrip("-")
    if first.isupper() and first.isalpha() and first not in ("ERR", "WRONGTYPE"):
        return first
    script_error = re.search(r"-([A-Z]{3,}) ", words)
    if script_error and script_error.group(1) != "ERR":
        return script_error.group(1)
    if isinstance(exc, redis.exceptions.TimeoutError) or "Timeout" in type(exc).__name__:
        return "TIMEOUT"
    if isinstance(exc, (redis.exceptions.ConnectionError, OSError)):
        return "CONNECTION"
    return None


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the server cannot be reached now (refused, reset,
    timed out, still loading its data), so that the next call would fail too:
    what opens a circuit breaker. A refusal the server answered (``OOM``,
    ``READONLY``, ``BUSY``...) is not one, nor this process's own pool
    running out of connections."""
    if isinstance(exc, (Skipped, redis.exceptions.MaxConnectionsError)):
        return False
    if isinstance(exc, redis.exceptions.BusyLoadingError):
        return True
    if not isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return False
    return error_code(exc) in ("TIMEOUT", "CONNECTION")


def server_words(exc: BaseException) -> str:
    """``exc``'s message with the server's error code put back in front
    (``MOVED 7786 127.0.0.1:7001``, not ``7786 127.0.0.1:7001``)."""
    text = str(exc) or type(exc).__name__  # MaxConnectionsError has no words of its own
    code = next((code for kind, code in _ERROR_CODES.items() if isinstance(exc, kind)), None)
    return f"{code} {text}" if code and not text.startswith(code) else text


_AUTH_CODES = ("WRONGPASS", "NOAUTH")
_URL_CREDENTIALS = "the URL (redis://user:password@host:6379/0) or the client's password= (and username=)"


def misconfiguration(exc: BaseException, *, cluster: bool, namespace: str) -> str | None:
    """What to fix when ``exc`` says that the client is set up wrong rather
    than that Redis fails: a password refused or missing, an ACL user
    refused a command or key, a plain client sent to another node of a
    Redis Cluster (MOVED, ASK: ``cluster``, whether the client is a cluster
    client, which follows them itself). ``None`` for anything else.

    Such an error is no outage: waiting does not mend it, and ``fail_open``
    must not hide it."""
    words = server_words(exc)
    if isinstance(exc, redis.exceptions.AuthenticationError) or words.startswith(_AUTH_CODES):
        if "without any password configured" in words or "no password is set" in words:
            return (
                "the client gives a password and the server has none: remove the password from "
                f"{_URL_CREDENTIALS}, or give the server one (requirepass, or an ACL user)"
            )
        if any(sign in words for sign in ("NOAUTH", "Authentication required", "already authenticated")):
            return f"the server needs a password and the client gives none: set it in {_URL_CREDENTIALS}"
        return (
            "the server refused the password: check the password (and, for an ACL user, the "
            f"username) in {_URL_CREDENTIALS}"
        )
    if isinstance(exc, redis.exceptions.AuthenticationWrongNumberOfArgsError):
        return (
            "the server takes a password alone (it has no ACL users, before Redis 6): give no "
            f"username in {_URL_CREDENTIALS}"
        )
    if isinstance(exc, redis.exceptions.NoPermissionError) or words.startswith("NOPERM"):
        return (
            "the ACL user lacks a permission that stampede needs: it may not run that command or "
            "reach that key or channel. Check its rules (ACL GETUSER <user>): it needs the commands "
            "of the ACL line in stampede's documentation (Deployment, Least privilege), and the "
            "keys and channels of namespace "
            f"{namespace!r} (~{namespace}:{{* &{namespace}:{{* &stampede:anchor:*)"
        )
    if "DB index is out of range" in words or words == "Invalid Database":
        return (
            "the server has no such database: use a database number below its databases "
            "setting (16 by default) in the URL (redis://host:6379/0) or the client's db="
        )
    if not cluster and (isinstance(exc, redis.exceptions.AskError) or words.startswith(("MOVED ", "ASK "))):
        return (
            "this node is part of a Redis Cluster: use redis+cluster://host:port (or cluster=True), "
            "or give a RedisCluster client, not one of a single server"
        )
    return None


_REDIS_PY = os.path.dirname(redis.exceptions.__file__) + os.sep


#: What a command to Redis raises when Redis fails it. RedisClusterException
#: is not a RedisError (a cluster that cannot route a command, a refused
#: pipeline): a Redis failure all the same. An AttributeError only where
#: :func:`failure_of` finds a connection torn down under the command.
FAILURES = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, AttributeError)


def failure_of(exc: Exception) -> Exception | None:
    """The Redis failure that ``exc``, one of :data:`FAILURES`, stands for;
    ``None``: an AttributeError of a bug, to be left raised."""
    return lost_connection(exc) if isinstance(exc, AttributeError) else exc


def lost_connection(exc: AttributeError) -> redis.exceptions.ConnectionError | None:
    """``exc`` as the connection failure it is, if redis-py raised it on a
    connection that another task tore down under the command (its asyncio
    cluster client disconnects a node's connections, in-use ones included,
    after MOVED replies or a failed node: the next write finds its writer
    ``None``); else ``None`` (a bug of its own, to be left raised)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or not tb.tb_frame.f_code.co_filename.startswith(_REDIS_PY) or "'NoneType'" not in str(exc):
        return None
    lost = redis.exceptions.ConnectionError(f"connection closed under the command ({exc})")
    lost.__cause__ = exc
    return lost


def translated(
    failure: BaseException, doing: str, *, client: Any, cluster: bool, namespace: str
) -> StampedeError:
    """redis-py's ``failure`` while trying to ``doing`` (``"read key 'k'"``)
    on ``client``, as stampede raises it: a :class:`ConfigurationError` when
    the client is set up wrong (a wrong password, an ACL, a cluster node
    taken for a server; no outage, so ``fail_open`` does not hide it), else
    a :class:`RedisUnavailableError`."""
    words = server_words(failure)
    fix = misconfiguration(failure, cluster=cluster, namespace=namespace)
    if fix is not None:
        return ConfigurationError(f"Redis refused to {doing} ({words}): {fix}")
    code, skipped = error_code(failure), isinstance(failure, Skipped)
    sentinels = sentinel_failure(client, failure)
    if sentinels is not None:
        return RedisUnavailableError(f"Redis failed to {doing}: {sentinels}", code=code, skipped=skipped)
    return RedisUnavailableError(f"Redis failed to {doing}: {words}", code=code, skipped=skipped)
