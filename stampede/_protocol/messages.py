"""The scripts' arguments and replies: what each operation sends to its
script (``stampede/_protocol/scripts.py``) and what its reply means.

Free of I/O: the drivers send what these build and hand the replies back.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from .._core.keys import Keys
from .._core.ops import CANCELLED, RELEASED, Acquired, Commit, Refused, Release
from .._core.options import Options
from .._core.tags import SUFFIX
from .._exceptions import ConfigurationError

__all__ = [
    "acquire_args",
    "acquired",
    "commit_args",
    "commit_outcome",
    "delete_args",
    "extend_args",
    "holder",
    "incr_args",
    "incr_result",
    "invalidate_args",
    "release_args",
    "touch_args",
    "unlink_plan",
    "write_args",
]


# --- leases -------------------------------------------------------------------

#: This host's name as lease records carry it: printable, without the
#: separator, and short (a record is read by every waiter).
_HOST = "".join(c for c in socket.gethostname() if c.isprintable() and c != ":")[:64] or "?"


def acquire_args(token: str, options: Options, reads: bool) -> list[Any]:
    """ACQUIRE's: a read (``reads``) gets no lease on a key marked unfilled; the
    lease's record is kept as long as its holder may store (``lapse_ms``), and
    names this process (``host:pid``) for operators to see."""
    return [token, options.lease_ms, "r" if reads else "", options.lapse_ms, holder()]


def holder() -> str:
    """This process, as lease records name it: ``host:pid`` (the pid read now:
    a forked child is another holder)."""
    return f"{_HOST}:{os.getpid()}"


def acquired(reply: Any) -> Acquired:
    """ACQUIRE's reply: ``{1, current, won_at, failures}`` won, ``{0, pttl}``
    held by another, ``{2, pttl}`` marked as a key that reads do not fill,
    ``{3, retry_in_ms, error, failures}`` the last rebuild raised."""
    if reply[0] == 1:
        won_at = reply[2]
        return Acquired(
            True,
            reply[1],
            won_at=won_at.decode() if isinstance(won_at, bytes) else won_at,
            failures=int(reply[3]) if len(reply) > 3 else 0,
        )
    if reply[0] == 3:
        error = reply[2]
        text = error.decode(errors="replace") if isinstance(error, bytes) else str(error)
        return Acquired(False, lease_pttl=int(reply[1]), failed=text, failures=int(reply[3]))
    return Acquired(False, lease_pttl=int(reply[1]), unfilled=reply[0] == 2)


def extend_args(token: str, options: Options) -> list[Any]:
    """EXTEND's: the lease's token and its new time to live."""
    return [token, options.lease_ms]


def commit_args(commit: Commit, keys: Keys, options: Options) -> list[Any]:
    """COMMIT's: ``if_lapsed`` lets a lease that lapsed store while its record
    is there still (nobody wrote the key or took it over)."""
    return [commit.token, commit.data, options.expire_ms or 0, keys.channel, "1" if commit.if_lapsed else ""]


def commit_outcome(reply: Any) -> bool | Refused:
    """COMMIT's reply: stored (``True``), or refused with what a newer write left."""
    if isinstance(reply, list):
        return Refused(reply[1] if len(reply) > 1 else None)
    return True


def release_args(release: Release, keys: Keys, options: Options) -> list[Any]:
    """RELEASE's: what the waiters are told, and for how long to mark the key
    as one that reads do not fill (0: not at all)."""
    unfilled_ms = options.unfilled_ms if release.unfilled else 0
    args = [release.token, keys.channel, CANCELLED if release.retake else RELEASED, unfilled_ms]
    failed = release.failed
    if failed is not None:
        args += [failed.failures, failed.backoff_ms, failed.keep_ms, failed.error]
    return args


# --- writes -------------------------------------------------------------------


def write_args(keys: Keys, data: bytes, options: Options) -> list[Any]:
    """WRITE's, storing ``data`` (an envelope) and cancelling any lease."""
    return [data, options.expire_ms or 0, keys.channel]


def delete_args(keys: Keys, as_of: float | None = None) -> list[Any]:
    """WRITE's, deleting the value and cancelling any lease; with ``as_of``
    (the server's clock), only what was written by then (see
    :func:`invalidate_args`)."""
    args: list[Any] = ["", 0, keys.channel]
    if as_of is not None:
        args.append(_seconds(as_of))
    return args


def invalidate_args(as_of: float | None = None) -> list[Any]:
    """INVALIDATE's; with ``as_of``, a removal owed through an outage, sent
    late: it reaches only what was written by then and cancels the rebuilds
    whose lease was won by then, while what was written since, and a lease
    won since, stay."""
    return [] if as_of is None else [_seconds(as_of)]


def _seconds(at: float) -> str:
    """A time as the scripts read it: seconds, to the microsecond."""
    return f"{at:.6f}"


def touch_args(fresh_until: bytes, options: Options) -> list[Any]:
    """TOUCH's: the header's new freshness bound and the key's new expiry."""
    return [fresh_until, options.expire_ms or 0]


def incr_args(delta: Any) -> list[Any]:
    """INCR's, ``delta`` checked."""
    if isinstance(delta, bool) or not isinstance(delta, int):
        raise ConfigurationError(f"delta must be an int, got {delta!r}", field="delta")
    return [delta]


def incr_result(keys: Keys, reply: list[Any]) -> int | None:
    """INCR's reply: the new integer, or ``None`` when there was no value."""
    status = int(reply[0])
    if status == 1:
        return int(reply[1])
    if status == 0:
        return None
    if status == -1:
        raise TypeError(f"the value of key {keys.name!r} is not an integer")
    raise OverflowError(f"incrementing key {keys.name!r} leaves the 64-bit integer range")


# --- deleting by pattern ------------------------------------------------------


def unlink_plan(
    prefix: bytes, names: list[bytes], *, under: bytes, tag_states: bool = False
) -> tuple[list[bytes], list[bytes], list[Keys]]:
    """Sort names that ``SCAN`` found under the namespace ``prefix`` for
    deleting the values whose names start with ``under``: values and other
    keys to unlink, and keys whose rebuild is under way (they have a lease)
    to delete as ``delete`` does, so that rebuild cannot store what it read
    before. Tags' states are unlinked only with ``tag_states`` (``clear``):
    other entries may carry a tag whose name starts like a prefix of keys;
    the namespace's never."""
    leased: set[bytes] = set()
    values: list[bytes] = []
    others: list[bytes] = []
    for name in names:
        if b"}" not in name:  # a value's name: the only kind without one
            if name.startswith(under):
                values.append(name)
            continue
        if name.endswith(SUFFIX):  # a tag's state
            # Not the namespace's: lost, it would be made again by the next
            # reader, and the entries that processes which read it lately
            # still write would read as missing.
            if tag_states and name != prefix + SUFFIX:
                others.append(name)
            continue
        end = name.rfind(b"}")
        value = name[len(prefix) : end]  # what a lease or scratch key is beside
        if not name.startswith(prefix) or not value.startswith(under):
            continue
        if name[end:] == b"}:lease":
            leased.add(value)
        else:
            others.append(name)
    values = [name for name in values if name not in leased]
    fenced = [Keys(value.decode("utf-8", "backslashreplace"), value) for value in sorted(leased)]
    return values, others, fenced
