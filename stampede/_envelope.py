"""The stored form of a value: a fixed binary header, then the payload.

One Redis string holds everything a read needs, so a hit is a single GET::

    offset  size  field
    0       2     magic b"\\xa7S"
    2       1     format version (1)
    3       1     codec id of the serializer that wrote the payload, or 0:
                  an int in decimal ASCII (any serializer reads it, and
                  Lua scripts can increment it in place)
    4       8     fresh_until: wall-clock seconds (float64, little endian)
    12      8     created_at: wall-clock seconds (float64)
    20      4     duration of the rebuild that produced it, seconds (float32)
    24      ...   payload

Wall-clock time because these timestamps are shared between hosts.
"""

from __future__ import annotations

import math
import random
import struct
import time
from typing import Any, NamedTuple

from ._serializers import Serializer

__all__ = [
    "FRESH_UNTIL_OFFSET",
    "HEADER",
    "INT_CODEC",
    "MAGIC",
    "CorruptEntryError",
    "Entry",
    "decode",
    "encode",
]

MAGIC = b"\xa7S\x01"  # magic and format version: what a reader checks first
HEADER = struct.Struct("<3sBddf")
INT_CODEC = 0
FRESH_UNTIL_OFFSET = 4
FOREVER = math.inf
_COPY_BELOW = 16 * 1024
_unpack_header = HEADER.unpack_from
_HEADER_SIZE = HEADER.size
#: Builds an Entry from a tuple without NamedTuple's Python-level __new__.
_entry = tuple.__new__


class Entry(NamedTuple):
    """A decoded value with its metadata.

    Attributes:
        value: the cached value.
        fresh_until: wall-clock time after which the value is stale.
        created_at: wall-clock time at which it was written.
        duration: seconds the rebuild that produced it took.
    """

    value: Any
    fresh_until: float
    created_at: float
    duration: float

    def is_fresh(self, now: float | None = None) -> bool:
        """Whether the value is within its ``ttl`` at wall-clock ``now`` (default: now)."""
        return (time.time() if now is None else now) < self.fresh_until

    def wants_early_refresh(self, now: float, beta: float | None) -> bool:
        """XFetch: whether to refresh this still-fresh value early.

        Refresh when ``now - duration * beta * ln(u) >= fresh_until`` for a
        uniform ``u`` in (0, 1]: unlikely long before expiry, near certain
        just before it, and earlier for values that take longer to rebuild.
        """
        if beta is None or self.fresh_until == FOREVER:
            return False
        gap = -self.duration * beta * math.log(1.0 - random.random())
        return now + gap >= self.fresh_until


def encode(
    serializer: Serializer,
    value: Any,
    *,
    fresh_until: float,
    created_at: float,
    duration: float,
) -> bytes:
    """Serialize ``value`` into an envelope; the serializer's errors propagate."""
    if type(value) is int:  # exactly int: bool and int subclasses go to the serializer
        codec_id, payload = INT_CODEC, str(value).encode()
    else:
        codec_id, payload = serializer.codec_id, serializer.dumps(value)
    return HEADER.pack(MAGIC, codec_id, fresh_until, created_at, duration) + payload


class CorruptEntryError(Exception):
    """Internal: bytes under a key are not an envelope this serializer can read."""


def decode(serializer: Serializer, raw: bytes) -> Entry:
    """Decode an envelope, raising :class:`CorruptEntryError` for anything foreign."""
    # On every hit: written for speed (one unpack, no slice to check the magic).
    try:
        magic, codec_id, fresh_until, created_at, duration = _unpack_header(raw)
    except struct.error:
        magic = None
    if magic != MAGIC:
        raise CorruptEntryError("not a stampede envelope of a known format version")
    if codec_id == INT_CODEC:
        try:
            return _entry(Entry, (int(raw[_HEADER_SIZE:]), fresh_until, created_at, duration))
        except ValueError as exc:
            raise CorruptEntryError(f"integer payload does not decode: {exc}") from exc
    if codec_id != serializer.codec_id:
        raise CorruptEntryError(
            f"written by serializer codec {codec_id}, this one reads codec " f"{serializer.codec_id}"
        )
    # A memoryview avoids copying a large payload; a small one is quicker to copy.
    payload = raw[_HEADER_SIZE:] if len(raw) < _COPY_BELOW else memoryview(raw)[_HEADER_SIZE:]
    try:
        value = serializer.loads(payload)
    except Exception as exc:
        raise CorruptEntryError(f"payload does not decode: {exc!r}") from exc
    return _entry(Entry, (value, fresh_until, created_at, duration))
