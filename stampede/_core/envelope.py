"""The stored form of a value: a 16-byte header, then the payload.

One Redis string holds everything a read needs, so a hit is a single GET::

    offset  size  field
    0       1     kind: 0xB0 (this format) plus flags: 0x01 signed, 0x02
                  tagged, 0x04 compressed, 0x08 stale (set in place by Redis)
    1       6     created_at: Redis's clock when it was written, milliseconds
                  since the epoch, rounded up (uint48, little endian)
    7       1     codec id of the serializer that wrote the payload, or 0: an
                  int (any serializer reads it), in decimal ASCII in an
                  unsigned value (Lua scripts increment it in place), in
                  two's complement (little endian, as short as it goes) in a
                  signed one (only a client, which can sign, changes it)
    8       6     fresh_until: wall-clock milliseconds (uint48); all ones: never
    14      2     duration of the rebuild that produced it, seconds (float16)
    16      ...   a tag block (tagged), then the payload (zlib-deflated when
                  compressed), then a 16-byte signature (signed)

Wall-clock time because these timestamps are shared between hosts.

The signature is HMAC-SHA256, truncated to 128 bits, of the Redis key's
length (uint32) and name, the kind byte without the stale flag, and every
byte from offset 7 to the signature: so a value forged, altered or copied to
another key does not verify, and it is checked before anything else is
read. Not signed: created_at, which Redis stamps on every write (it orders
writes, for fencing; it does not decide what is served), and the stale flag,
which Redis sets to mark a value stale (``invalidate``): setting it can only
make a value stale sooner.

An entry that records tag versions (see ``stampede._core.tags``) carries a
tag block before its payload::

    +0      2     block length L (uint16)
    +2      8     the namespace's version (uint64)
    +10     1     how many tags
    +11     ...   per tag: its version (uint64), its id's length (uint8), its id

Every entry has one: an entry without tags records its namespace's version
(:data:`NAMESPACE_BLOCK_SIZE` bytes), so that a namespace's state that was
lost is never taken for one never invalidated.

Payloads of ``compress_above`` bytes or more are stored deflated when that
saves at least an eighth of them; a reader inflates at most
:data:`MAX_INFLATED` bytes (a larger one is unreadable: a miss, never a memory
bomb).

Values written by stampede before this format (their first bytes
``b"\\xa7S"``) read as a miss, once: the rebuild stores them in this one.
"""

from __future__ import annotations

import math
import random
import struct
import time
import zlib
from typing import Any, NamedTuple

from .tags import Captured

__all__ = [
    "CODEC_AT",
    "COMPRESSED",
    "CREATED_AT_AT",
    "FOREVER",
    "FRESH_UNTIL_AT",
    "HEADER",
    "HEADER_SIZE",
    "INT_CODEC",
    "KIND",
    "MAC_SIZE",
    "MAX_INFLATED",
    "NAMESPACE_BLOCK_SIZE",
    "NEVER",
    "OLD_FORMAT",
    "SIGNED",
    "STALE",
    "TAGGED",
    "CorruptEntryError",
    "Dropped",
    "Entry",
    "fresh_until_bytes",
    "header",
    "inflated",
    "milliseconds",
    "pack_header",
    "read_block",
    "tag_block",
]

#: The first byte's high nibble: this format. The low nibble holds the flags.
KIND = 0xB0
SIGNED = 0x01
TAGGED = 0x02
COMPRESSED = 0x04
STALE = 0x08
HEADER = struct.Struct(
    "<BIHBIHe"
)  # kind, created_at (low 32, high 16 bits), codec, fresh_until (same), duration
HEADER_SIZE = HEADER.size
#: Where created_at, the codec id and fresh_until start (0-based), for the Lua scripts.
CREATED_AT_AT = 1
CODEC_AT = 7
FRESH_UNTIL_AT = 8
MAC_SIZE = 16
INT_CODEC = 0
#: fresh_until of a value that never goes stale.
NEVER = 2**48 - 1
FOREVER = math.inf
#: The most bytes a compressed payload may inflate to.
MAX_INFLATED = 512 * 1024 * 1024
_LARGEST_HALF = 65504.0  # the largest float16
OLD_FORMAT = 0xA7  # the first byte of stampede's earlier formats
pack_header = HEADER.pack
_BLOCK_LENGTH = struct.Struct("<H")
_BLOCK_HEAD = struct.Struct("<QB")  # the namespace's version, how many tags
#: The tag block of an entry that carries no tag: its namespace's version.
NAMESPACE_BLOCK_SIZE = _BLOCK_LENGTH.size + _BLOCK_HEAD.size
_MARK = struct.Struct("<QB")  # a tag's version, its id's length


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


class CorruptEntryError(Exception):
    """Internal: bytes under a key are not an envelope this serializer can read."""


class Dropped(Exception):
    """Internal: the entry carries a tag deleted since it was written: a miss."""


def milliseconds(seconds: float) -> int:
    if seconds >= NEVER / 1000:
        return NEVER
    return max(0, int(seconds * 1000))


def fresh_until_bytes(fresh_until: float) -> bytes:
    """``fresh_until`` as the header stores it (for ``touch`` in place)."""
    return milliseconds(fresh_until).to_bytes(6, "little")


def header(kind: int, codec_id: int, *, fresh_until: float, created_at: float, duration: float) -> bytes:
    """The 16-byte header of an envelope."""
    created, fresh = milliseconds(created_at), milliseconds(fresh_until)
    duration = min(max(duration, 0.0), _LARGEST_HALF)
    return pack_header(
        kind, created & 0xFFFFFFFF, created >> 32, codec_id, fresh & 0xFFFFFFFF, fresh >> 32, duration
    )


def tag_block(captured: Captured) -> bytes:
    """The tag block recording ``captured``."""
    parts = [_BLOCK_HEAD.pack(max(captured.namespace, 0), len(captured.tags))]
    for tag, version in captured.tags:
        parts.append(_MARK.pack(max(version, 0), len(tag)))
        parts.append(tag)
    body = b"".join(parts)
    return _BLOCK_LENGTH.pack(len(body)) + body


def read_block(raw: bytes, at: int) -> tuple[int, tuple[tuple[bytes, int], ...], int]:
    """The tag block at ``at``: the namespace's version, the tags' versions by
    id, and where the payload starts."""
    try:
        (length,) = _BLOCK_LENGTH.unpack_from(raw, at)
        end = at + 2 + length
        namespace, count = _BLOCK_HEAD.unpack_from(raw, at + 2)
        position = at + 2 + _BLOCK_HEAD.size
        tags = []
        for _ in range(count):
            version, size = _MARK.unpack_from(raw, position)
            position += _MARK.size
            tags.append((bytes(raw[position : position + size]), version))
            position += size
    except struct.error as exc:
        raise CorruptEntryError(f"tag block does not decode: {exc}") from exc
    if position != end or end > len(raw):
        raise CorruptEntryError("tag block does not decode: its length disagrees with its tags")
    return namespace, tuple(tags), end


def inflated(payload: bytes | memoryview) -> bytes:
    """A compressed payload inflated, refusing one larger than :data:`MAX_INFLATED`."""
    inflater = zlib.decompressobj()
    plain = inflater.decompress(payload, MAX_INFLATED)
    if inflater.unconsumed_tail or not inflater.eof:
        raise ValueError(f"compressed payload larger than {MAX_INFLATED} bytes, or truncated")
    return plain
