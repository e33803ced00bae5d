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

A signed value (format version 2) has the same header, then::

    24      32    HMAC-SHA256 tag of the Redis key's length (uint32) and
                  name, then of every byte from offset 56 to the end
    56      8     fresh_until as signed
    64      1     codec id as signed
    65      4     duration as signed
    69      ...   payload

So a value forged, altered or copied to another key does not verify, and
the tag is checked before anything else is read. A reader takes the codec
and duration from the signed copies, and the earlier of the two
fresh_until: the header's own (4-11) stays unsigned because Redis lowers it
in place to mark a value stale (``invalidate``), so altering it can only
make a value stale sooner. created_at (12-19) is stamped by Redis's clock
on every write and is not signed: it orders writes (fencing), it does not
decide what is served. The signed fields are contiguous so that verifying
costs one HMAC over one slice.
"""

from __future__ import annotations

import math
import random
import struct
import time
from typing import Any, NamedTuple

from .serializers import Serializer
from .signing import Signer

__all__ = [
    "FRESH_UNTIL_OFFSET",
    "HEADER",
    "INT_CODEC",
    "MAGIC",
    "SIGNED_MAGIC",
    "SIGNED_PAYLOAD_AT",
    "Codec",
    "CorruptEntryError",
    "Entry",
    "decode",
    "encode",
]

MAGIC = b"\xa7S\x01"  # magic and format version: what a reader checks first
SIGNED_MAGIC = b"\xa7S\x02"
HEADER = struct.Struct("<3sBddf")
_SIGNED = struct.Struct("<dBf")  # fresh_until, codec id, duration
_TAG_AT = HEADER.size
_SIGNED_AT = _TAG_AT + 32
SIGNED_PAYLOAD_AT = _SIGNED_AT + _SIGNED.size
_unpack_signed = _SIGNED.unpack_from
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


class Codec:
    """How one instance writes and reads envelopes: its serializer and, when
    values are signed, its :class:`~stampede._core.signing.Signer`."""

    __slots__ = ("_verified", "_verified_bytes", "decode", "magic", "serializer", "signer")

    def __init__(self, serializer: Serializer, signer: Signer | None = None) -> None:
        self.serializer = serializer
        self.signer = signer
        self.magic = MAGIC if signer is None else SIGNED_MAGIC
        #: ``decode(name, raw)``: the :class:`Entry` stored as ``raw`` under the
        #: Redis key ``name``, or :class:`CorruptEntryError`.
        self.decode = self._decode_unsigned if signer is None else self._decode_signed
        # The bytes last verified under each Redis key: a hot key's next read
        # returns the very same bytes, which need no second HMAC (the same
        # bytes verify the same way). Bounded by _VERIFIED_*.
        self._verified: dict[bytes, bytes] = {}
        self._verified_bytes = 0

    def encode(
        self, name: bytes, value: Any, *, fresh_until: float, created_at: float, duration: float
    ) -> bytes:
        """The envelope of ``value`` to store under the Redis key ``name``."""
        if self.signer is None:
            return encode(
                self.serializer, value, fresh_until=fresh_until, created_at=created_at, duration=duration
            )
        if type(value) is int:
            codec_id, payload = INT_CODEC, str(value).encode()
        else:
            codec_id, payload = self.serializer.codec_id, self.serializer.dumps(value)
        return self._signed(name, fresh_until, created_at, codec_id, duration, payload)

    def resigned(
        self, name: bytes, raw: bytes, *, payload: bytes | None = None, fresh_until: float | None = None
    ) -> bytes:
        """A verified signed envelope ``raw`` with a new integer ``payload`` or a
        new ``fresh_until``, signed again (``incr`` and ``touch`` of signed values)."""
        _, codec_id, header_until, created_at, _ = _unpack_header(raw)
        signed_until, codec_id, duration = _unpack_signed(raw, _SIGNED_AT)
        if fresh_until is None:
            fresh_until = min(header_until, signed_until)
        if payload is None:
            payload = raw[SIGNED_PAYLOAD_AT:]
        else:
            codec_id = INT_CODEC
        return self._signed(name, fresh_until, created_at, codec_id, duration, payload)

    def _signed(
        self,
        name: bytes,
        fresh_until: float,
        created_at: float,
        codec_id: int,
        duration: float,
        payload: bytes,
    ) -> bytes:
        assert self.signer is not None
        signed = _SIGNED.pack(fresh_until, codec_id, duration) + payload
        tag = self.signer.sign(_name_part(name), signed)
        return HEADER.pack(SIGNED_MAGIC, codec_id, fresh_until, created_at, duration) + tag + signed

    def _verify(self, name: bytes, raw: bytes, view: bytes | memoryview) -> None:
        assert self.signer is not None
        if not self.signer.verify(view[_TAG_AT:_SIGNED_AT], _name_part(name), view[_SIGNED_AT:]):
            raise CorruptEntryError(
                "the signature does not match: the value was forged or altered, copied from "
                "another key, or signed with a key this instance does not have"
            )
        if len(raw) <= _VERIFIED_LARGEST:
            if len(self._verified) >= _VERIFIED_KEYS or self._verified_bytes > _VERIFIED_BYTES:
                self._verified.clear()  # simpler than an LRU, and as good for a hot set that fits
                self._verified_bytes = 0
            self._verified[name] = raw
            self._verified_bytes += len(raw)

    def _decode_unsigned(self, name: bytes, raw: bytes) -> Entry:
        return decode(self.serializer, raw)

    def _decode_signed(self, name: bytes, raw: bytes) -> Entry:
        # On every hit: the tag is checked before anything else is read.
        if raw[:3] != SIGNED_MAGIC or len(raw) < SIGNED_PAYLOAD_AT:
            if raw[:3] == MAGIC:
                raise CorruptEntryError("the value is not signed, and this instance reads signed values only")
            raise CorruptEntryError("not a signed stampede envelope")
        large = len(raw) >= _COPY_BELOW
        view = memoryview(raw) if large else raw
        if self._verified.get(name) != raw:  # a comparison with public bytes: no secret to time
            self._verify(name, raw, view)
        (header_until, created_at) = _unpack_times(raw, FRESH_UNTIL_OFFSET)
        signed_until, codec_id, duration = _unpack_signed(raw, _SIGNED_AT)
        # Redis may have lowered the header's copy (invalidate); never raised it.
        fresh_until = header_until if header_until < signed_until else signed_until
        if codec_id == INT_CODEC:
            try:
                return _entry(Entry, (int(raw[SIGNED_PAYLOAD_AT:]), fresh_until, created_at, duration))
            except ValueError as exc:
                raise CorruptEntryError(f"integer payload does not decode: {exc}") from exc
        serializer = self.serializer
        if codec_id != serializer.codec_id:
            raise CorruptEntryError(
                f"written by serializer codec {codec_id}, this one reads codec {serializer.codec_id}"
            )
        try:
            value = serializer.loads(view[SIGNED_PAYLOAD_AT:])
        except Exception as exc:
            raise CorruptEntryError(f"payload does not decode: {exc!r}") from exc
        return _entry(Entry, (value, fresh_until, created_at, duration))


_unpack_times = struct.Struct("<dd").unpack_from
#: What Codec keeps of the bytes it verified: values up to 16 KiB, of up to
#: 4096 keys, 8 MiB in all (a bound on memory, not on correctness).
_VERIFIED_LARGEST = 16 * 1024
_VERIFIED_KEYS = 4096
_VERIFIED_BYTES = 8 * 1024 * 1024


def _name_part(name: bytes) -> bytes:
    # Length first: no two (key, value) pairs sign the same bytes.
    return struct.pack("<I", len(name)) + name
