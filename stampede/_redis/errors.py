"""redis-py's errors as stampede reports them: the server's own words, and a
connection torn down under a command told from a bug."""

from __future__ import annotations

import os

import redis.exceptions

__all__ = ["lost_connection", "server_words"]


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


def server_words(exc: BaseException) -> str:
    """``exc``'s message with the server's error code put back in front
    (``MOVED 7786 127.0.0.1:7001``, not ``7786 127.0.0.1:7001``)."""
    text = str(exc) or type(exc).__name__  # MaxConnectionsError has no words of its own
    code = next((code for kind, code in _ERROR_CODES.items() if isinstance(exc, kind)), None)
    return f"{code} {text}" if code and not text.startswith(code) else text


_REDIS_PY = os.path.dirname(redis.exceptions.__file__) + os.sep


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
