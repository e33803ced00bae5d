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

An entry that records tag versions (see ``stampede._core.tags``) is written
in format version 3 (unsigned) or 4 (signed): the same fields, then, where
the payload began, a tag block, then the payload::

    +0      2     block length L (uint16)
    +2      8     the namespace's version (uint64)
    +10     1     how many tags
    +11     ...   per tag: its version (uint64), its id's length (uint8), its id

A signed entry's block is inside what its HMAC covers. An entry of a
namespace never invalidated as a whole, and without tags, keeps format 1 or 2.
"""

from __future__ import annotations

import math
import random
import struct
import time
from typing import Any, NamedTuple

from .serializers import Serializer
from .signing import Signer
from .tags import DELETED, FRESH, UNTAGGED, Captured, TagStates

__all__ = [
    "FRESH_UNTIL_OFFSET",
    "HEADER",
    "INT_CODEC",
    "MAGIC",
    "SIGNED_MAGIC",
    "SIGNED_PAYLOAD_AT",
    "TAGGED_MAGIC",
    "Codec",
    "CorruptEntryError",
    "Dropped",
    "Entry",
    "decode",
    "encode",
]

MAGIC = b"\xa7S\x01"  # magic and format version: what a reader checks first
SIGNED_MAGIC = b"\xa7S\x02"
TAGGED_MAGIC = b"\xa7S\x03"
SIGNED_TAGGED_MAGIC = b"\xa7S\x04"
#: What every format starts with: the fixed fields are where Lua scripts find them.
FAMILY = b"\xa7S"
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
_BLOCK_LENGTH = struct.Struct("<H")
_BLOCK_HEAD = struct.Struct("<QB")  # the namespace's version, how many tags
_MARK = struct.Struct("<QB")  # a tag's version, its id's length
_monotonic = time.monotonic


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


class Dropped(Exception):
    """Internal: the entry carries a tag deleted since it was written: a miss."""


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
    """How one instance writes and reads envelopes: its serializer, its
    :class:`~stampede._core.signing.Signer` when values are signed, and the
    tag states its reads are judged by."""

    __slots__ = ("_verified", "_verified_bytes", "magic", "serializer", "signer", "tags")

    def __init__(
        self, serializer: Serializer, signer: Signer | None = None, tags: TagStates | None = None
    ) -> None:
        self.serializer = serializer
        self.signer = signer
        self.tags = tags
        self.magic = MAGIC if signer is None else SIGNED_MAGIC
        # The bytes last verified under each Redis key: a hot key's next read
        # returns the very same bytes, which need no second HMAC (the same
        # bytes verify the same way). Bounded by _VERIFIED_*.
        self._verified: dict[bytes, bytes] = {}
        self._verified_bytes = 0

    def encode(
        self,
        name: bytes,
        value: Any,
        *,
        fresh_until: float,
        created_at: float,
        duration: float,
        captured: Captured = UNTAGGED,
    ) -> bytes:
        """The envelope of ``value`` to store under the Redis key ``name``,
        recording the tag versions ``captured``."""
        if type(value) is int:  # exactly int: bool and int subclasses go to the serializer
            codec_id, payload = INT_CODEC, str(value).encode()
        else:
            codec_id, payload = self.serializer.codec_id, self.serializer.dumps(value)
        block = b"" if captured == UNTAGGED else tag_block(captured)
        if self.signer is None:
            magic = TAGGED_MAGIC if block else MAGIC
            return HEADER.pack(magic, codec_id, fresh_until, created_at, duration) + block + payload
        return self._signed(name, fresh_until, created_at, codec_id, duration, block, payload)

    def resigned(
        self, name: bytes, raw: bytes, *, payload: bytes | None = None, fresh_until: float | None = None
    ) -> bytes:
        """A verified signed envelope ``raw`` with a new integer ``payload`` or a
        new ``fresh_until``, signed again (``incr`` and ``touch`` of signed values)."""
        _, codec_id, header_until, created_at, _ = _unpack_header(raw)
        signed_until, codec_id, duration = _unpack_signed(raw, _SIGNED_AT)
        block, payload_at = b"", SIGNED_PAYLOAD_AT
        if raw[:3] == SIGNED_TAGGED_MAGIC:
            payload_at = read_block(raw, SIGNED_PAYLOAD_AT)[2]
            block = raw[SIGNED_PAYLOAD_AT:payload_at]
        if fresh_until is None:
            fresh_until = min(header_until, signed_until)
        if payload is None:
            payload = raw[payload_at:]
        else:
            codec_id = INT_CODEC
        return self._signed(name, fresh_until, created_at, codec_id, duration, block, payload)

    def _signed(
        self,
        name: bytes,
        fresh_until: float,
        created_at: float,
        codec_id: int,
        duration: float,
        block: bytes,
        payload: bytes,
    ) -> bytes:
        assert self.signer is not None
        signed = _SIGNED.pack(fresh_until, codec_id, duration) + block + payload
        tag = self.signer.sign(_name_part(name), signed)
        magic = SIGNED_TAGGED_MAGIC if block else SIGNED_MAGIC
        return HEADER.pack(magic, codec_id, fresh_until, created_at, duration) + tag + signed

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

    def decode(self, name: bytes, raw: bytes, strict: bool = True, tracked: bool = False) -> Entry:
        """The :class:`Entry` stored as ``raw`` under the Redis key ``name``, as
        its tags make it (stale after ``invalidate_tags``). Raises
        :class:`CorruptEntryError` for anything foreign, :class:`Dropped` for
        an entry whose tag was deleted, and, ``strict``, ``TagsUnknown`` when
        the verdict needs tag states not read lately (not ``strict``: those
        count as unchanged). ``tracked``: the caller just found the tracking
        connection quiet (a near hit), so tracked states are exact."""
        # On every hit: written for speed.
        if self.signer is not None:
            return self._decode_signed(name, raw, strict, tracked)
        try:
            magic, codec_id, fresh_until, created_at, duration = _unpack_header(raw)
        except struct.error:
            magic = None
        tags: tuple[tuple[bytes, int], ...] = ()
        if magic == MAGIC:
            namespace, payload_at = 0, _HEADER_SIZE
        elif magic == TAGGED_MAGIC:
            namespace, tags, payload_at = read_block(raw, _HEADER_SIZE)
        else:
            if magic == SIGNED_MAGIC or magic == SIGNED_TAGGED_MAGIC:
                raise CorruptEntryError(
                    "the value is signed, and this instance has no signing key to read it"
                )
            raise CorruptEntryError("not a stampede envelope of a known format version")
        # Judged before the payload is decoded: a deleted entry costs no unpickling.
        fresh_until = self._judged(fresh_until, namespace, tags, strict, tracked)
        value = self._payload(raw, codec_id, payload_at)
        return _entry(Entry, (value, fresh_until, created_at, duration))

    @staticmethod
    def recorded(raw: Any) -> tuple[bytes, ...]:
        """The tag ids whose state judges ``raw`` (the namespace's, ``b""``,
        first), read from its header alone: nothing verified or decoded."""
        if not isinstance(raw, bytes):
            return ()
        magic = raw[:3]
        if magic == TAGGED_MAGIC or magic == SIGNED_TAGGED_MAGIC:
            try:
                _, tags, _ = read_block(raw, _HEADER_SIZE if magic == TAGGED_MAGIC else SIGNED_PAYLOAD_AT)
            except CorruptEntryError:
                return ()
            return (b"", *(tag for tag, _ in tags))
        return (b"",) if magic == MAGIC or magic == SIGNED_MAGIC else ()

    def _decode_signed(self, name: bytes, raw: bytes, strict: bool, tracked: bool) -> Entry:
        # On every hit: the tag is checked before anything else is read.
        magic = raw[:3]
        if (magic != SIGNED_MAGIC and magic != SIGNED_TAGGED_MAGIC) or len(raw) < SIGNED_PAYLOAD_AT:
            if magic == MAGIC or magic == TAGGED_MAGIC:
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
        tags: tuple[tuple[bytes, int], ...] = ()
        if magic == SIGNED_MAGIC:
            namespace, payload_at = 0, SIGNED_PAYLOAD_AT
        else:
            namespace, tags, payload_at = read_block(raw, SIGNED_PAYLOAD_AT)
        # Judged before the payload is decoded: a deleted entry costs no unpickling.
        fresh_until = self._judged(fresh_until, namespace, tags, strict, tracked)
        value = self._payload(view, codec_id, payload_at)
        return _entry(Entry, (value, fresh_until, created_at, duration))

    def _payload(self, raw: bytes | memoryview, codec_id: int, at: int) -> Any:
        if codec_id == INT_CODEC:
            try:
                return int(bytes(raw[at:]))
            except ValueError as exc:
                raise CorruptEntryError(f"integer payload does not decode: {exc}") from exc
        serializer = self.serializer
        if codec_id != serializer.codec_id:
            raise CorruptEntryError(
                f"written by serializer codec {codec_id}, this one reads codec {serializer.codec_id}"
            )
        # A memoryview avoids copying a large payload; a small one is quicker to copy.
        payload = raw[at:] if len(raw) < _COPY_BELOW else memoryview(raw)[at:]
        try:
            return serializer.loads(payload)
        except Exception as exc:
            raise CorruptEntryError(f"payload does not decode: {exc!r}") from exc

    def _judged(
        self,
        fresh_until: float,
        namespace: int,
        tags: tuple[tuple[bytes, int], ...],
        strict: bool,
        tracked: bool,
    ) -> float:
        """``fresh_until`` as the entry's tags leave it (0: stale); raises
        :class:`Dropped` (a tag deleted) or ``TagsUnknown``."""
        states = self.tags
        if states is not None:
            known = states.namespace
            # The common case, in three comparisons: no tags, and the namespace
            # as the entry recorded it (as read lately).
            if tags or known[0] != namespace or _monotonic() >= known[2]:
                verdict = states.verdict(namespace, tags, strict, tracked)
                if verdict == DELETED:
                    raise Dropped
                if verdict != FRESH and fresh_until > 0.0:
                    return 0.0  # stale, as invalidate() leaves a value
        return fresh_until


_unpack_times = struct.Struct("<dd").unpack_from
#: What Codec keeps of the bytes it verified: values up to 16 KiB, of up to
#: 4096 keys, 8 MiB in all (a bound on memory, not on correctness).
_VERIFIED_LARGEST = 16 * 1024
_VERIFIED_KEYS = 4096
_VERIFIED_BYTES = 8 * 1024 * 1024


def _name_part(name: bytes) -> bytes:
    # Length first: no two (key, value) pairs sign the same bytes.
    return struct.pack("<I", len(name)) + name
