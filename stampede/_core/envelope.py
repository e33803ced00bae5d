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

An entry of a namespace never invalidated as a whole, and without tags, has
none.

Payloads of ``compress_above`` bytes or more are stored deflated when that
saves at least an eighth of them; a reader inflates at most
:data:`MAX_INFLATED` bytes (a larger one is unreadable: a miss, never a memory
bomb).

Values written by stampede before this format (their first bytes
``b"\\xa7S"``) read as a miss, once: the rebuild stores them in this one.
"""

from __future__ import annotations

import math
import pickle
import random
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

from .serializers import PickleSerializer, Serializer
from .signing import Signer
from .tags import DELETED, FRESH, UNTAGGED, Captured, TagStates

__all__ = [
    "CODEC_AT",
    "COMPRESSED",
    "CREATED_AT_AT",
    "FRESH_UNTIL_AT",
    "HEADER_SIZE",
    "INT_CODEC",
    "KIND",
    "MAC_SIZE",
    "MAX_INFLATED",
    "NOT_PLAIN",
    "SIGNED",
    "STALE",
    "TAGGED",
    "Codec",
    "CorruptEntryError",
    "Dropped",
    "Entry",
    "decode",
    "encode",
    "fresh_until_bytes",
    "header",
    "read_block",
]

#: The first byte's high nibble: this format. The low nibble holds the flags.
KIND = 0xB0
SIGNED = 0x01
TAGGED = 0x02
COMPRESSED = 0x04
STALE = 0x08
_HEADER = struct.Struct(
    "<BIHBIHe"
)  # kind, created_at (low 32, high 16 bits), codec, fresh_until (same), duration
HEADER_SIZE = _HEADER.size
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
_OLD_FORMAT = 0xA7  # the first byte of stampede's earlier formats
_COPY_BELOW = 16 * 1024
_unpack_header = _HEADER.unpack_from
_pack_header = _HEADER.pack
#: What Codec.plain_value returns for anything but the common case.
NOT_PLAIN: Any = object()
#: Builds an Entry from a tuple without NamedTuple's Python-level __new__.
_entry = tuple.__new__
_BLOCK_LENGTH = struct.Struct("<H")
_BLOCK_HEAD = struct.Struct("<QB")  # the namespace's version, how many tags
_MARK = struct.Struct("<QB")  # a tag's version, its id's length
_monotonic = time.monotonic
_BYTE = [bytes((n,)) for n in range(256)]
_NOT_STALE = 0xFF ^ STALE


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


def _milliseconds(seconds: float) -> int:
    if seconds >= NEVER / 1000:
        return NEVER
    return max(0, int(seconds * 1000))


def fresh_until_bytes(fresh_until: float) -> bytes:
    """``fresh_until`` as the header stores it (for ``touch`` in place)."""
    return _milliseconds(fresh_until).to_bytes(6, "little")


def header(kind: int, codec_id: int, *, fresh_until: float, created_at: float, duration: float) -> bytes:
    """The 16-byte header of an envelope."""
    created, fresh = _milliseconds(created_at), _milliseconds(fresh_until)
    duration = min(max(duration, 0.0), _LARGEST_HALF)
    return _pack_header(
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


#: Why a value is a miss when the writer and the reader disagree about signing.
_SIGNED = (
    "the value is signed (its writer has a signing_key) and this instance has no signing_key, so "
    "it cannot verify it: it is read as a miss. Give every instance of the namespace the same "
    "signing_key (Django: OPTIONS['SIGNING_KEY'], Flask: STAMPEDE_SIGNING_KEY)"
)
_UNSIGNED = (
    "the value is not signed (its writer has no signing_key) and this instance, which has one, reads "
    "signed values only: it is read as a miss. Give every instance of the namespace the same "
    "signing_key (Django: OPTIONS['SIGNING_KEY'], Flask: STAMPEDE_SIGNING_KEY)"
)


def _foreign(raw: Any) -> CorruptEntryError:
    if isinstance(raw, (bytes, bytearray, memoryview)) and raw[:1] == bytes((_OLD_FORMAT,)):
        return CorruptEntryError("written in an earlier stampede format: a miss, rebuilt in this one")
    return CorruptEntryError("not a stampede envelope of a known format version")


class Codec:
    """How one instance writes and reads envelopes: its serializer, its
    :class:`~stampede._core.signing.Signer` when values are signed, the tag
    states its reads are judged by, and from what size payloads are
    compressed (``None``: never)."""

    __slots__ = (
        *("_loads", "_plain", "_verified", "_verified_bytes", "compress_above", "serializer", "signer"),
        "tags",
    )

    def __init__(
        self,
        serializer: Serializer,
        signer: Signer | None = None,
        tags: TagStates | None = None,
        compress_above: int | None = None,
    ) -> None:
        self.serializer = serializer
        self.signer = signer
        self.tags = tags
        self.compress_above = compress_above
        #: The kind byte of the common case (see plain_value), and the function
        #: that loads its payload: pickle.loads itself where the serializer
        #: would only call it (one call less a hit).
        self._plain = KIND if signer is None else KIND | SIGNED
        self._loads = pickle.loads if type(serializer) is PickleSerializer else serializer.loads
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
        kind = KIND
        if type(value) is int:  # exactly int: bool and int subclasses go to the serializer
            codec_id, payload = INT_CODEC, self._int_payload(value)
        else:
            codec_id, payload = self.serializer.codec_id, self.serializer.dumps(value)
            threshold = self.compress_above
            if threshold is not None and len(payload) >= threshold:
                packed = zlib.compress(payload)
                if len(packed) <= len(payload) - len(payload) // 8:  # worth inflating on every read
                    kind, payload = kind | COMPRESSED, packed
        block = b""
        if captured != UNTAGGED:
            kind, block = kind | TAGGED, tag_block(captured)
        if self.signer is not None:
            kind |= SIGNED
        head = header(kind, codec_id, fresh_until=fresh_until, created_at=created_at, duration=duration)
        if self.signer is None:
            return head + block + payload
        body = head + block + payload
        return body + self._mac(name, kind, memoryview(body)[CODEC_AT:])

    def _int_payload(self, number: int) -> bytes:
        if self.signer is None:
            return str(number).encode()
        return number.to_bytes((number + (number < 0)).bit_length() // 8 + 1, "little", signed=True)

    def resigned(
        self, name: bytes, raw: bytes, *, number: int | None = None, fresh_until: float | None = None
    ) -> bytes:
        """A verified signed envelope ``raw`` with a new integer ``number`` or a
        new ``fresh_until`` (no longer stale), signed again (``incr`` and
        ``touch`` of signed values)."""
        kind, c_low, c_high, codec_id, f_low, f_high, duration = _unpack_header(raw)
        payload_at = read_block(raw, HEADER_SIZE)[2] if kind & TAGGED else HEADER_SIZE
        block = raw[HEADER_SIZE:payload_at]
        if number is None:
            payload = raw[payload_at:-MAC_SIZE]
        else:
            codec_id, kind, payload = INT_CODEC, kind & ~COMPRESSED, self._int_payload(number)
        fresh = f_low | f_high << 32
        if fresh_until is not None:
            fresh, kind = _milliseconds(fresh_until), kind & _NOT_STALE
        body = (
            _pack_header(kind, c_low, c_high, codec_id, fresh & 0xFFFFFFFF, fresh >> 32, duration)
            + block
            + payload
        )
        return body + self._mac(name, kind, memoryview(body)[CODEC_AT:])

    def _mac(self, name: bytes, kind: int, signed: bytes | memoryview) -> bytes:
        assert self.signer is not None
        return self.signer.sign(_name_part(name), _BYTE[kind & _NOT_STALE], signed)

    def _verify(self, name: bytes, raw: bytes, kind: int) -> None:
        assert self.signer is not None
        view = memoryview(raw)
        signed = view[CODEC_AT:-MAC_SIZE]
        if not self.signer.verify(view[-MAC_SIZE:], _name_part(name), _BYTE[kind & _NOT_STALE], signed):
            raise CorruptEntryError(
                "the signature does not match: the value was forged or altered, copied from "
                "another key, or signed with a key this instance does not have (if its writers "
                "have another signing_key, give this instance the same, or list both while rotating)"
            )
        if len(raw) <= _VERIFIED_LARGEST:
            if len(self._verified) >= _VERIFIED_KEYS or self._verified_bytes > _VERIFIED_BYTES:
                self._verified.clear()  # simpler than an LRU, and as good for a hot set that fits
                self._verified_bytes = 0
            self._verified[name] = raw
            self._verified_bytes += len(raw)

    def plain_value(self, name: bytes, raw: Any, now: float) -> Any:
        """The value of ``raw``, read under ``name`` at wall-clock ``now``, if it
        is the common case of a hit: a fresh value of this serializer, neither
        tagged nor compressed nor stale, of a namespace never invalidated as
        a whole (as read lately), its signature checked before (the same
        bytes under the same key). Else :data:`NOT_PLAIN`: :meth:`decode`
        says what it is. A remote hit's path: written for speed."""
        try:
            kind, _, _, codec_id, f_low, f_high, _ = _unpack_header(raw)
        except (struct.error, TypeError):
            return NOT_PLAIN
        if kind != self._plain or codec_id != self.serializer.codec_id:
            return NOT_PLAIN
        if now * 1000 >= (f_low | f_high << 32):
            return NOT_PLAIN  # stale
        states = self.tags
        if states is not None:
            known = states.namespace
            if known[0] != 0 or _monotonic() >= known[2]:
                return NOT_PLAIN
        end = len(raw)
        if kind & SIGNED:
            if self._verified.get(name) != raw:  # a comparison with public bytes: no secret to time
                return NOT_PLAIN
            end -= MAC_SIZE
        payload = raw[HEADER_SIZE:end] if end < _COPY_BELOW else memoryview(raw)[HEADER_SIZE:end]
        try:
            return self._loads(payload)
        except Exception:
            return NOT_PLAIN  # decode() reports it

    def decode(self, name: bytes, raw: bytes, strict: bool = True, tracked: bool = False) -> Entry:
        """The :class:`Entry` stored as ``raw`` under the Redis key ``name``, as
        its tags make it (stale after ``invalidate_tags``). Raises
        :class:`CorruptEntryError` for anything foreign, :class:`Dropped` for
        an entry whose tag was deleted, and, ``strict``, ``TagsUnknown`` when
        the verdict needs tag states not read lately (not ``strict``: those
        count as unchanged). ``tracked``: the caller just found the tracking
        connection quiet (a near hit), so tracked states are exact."""
        # On every hit: written for speed.
        try:
            kind, c_low, c_high, codec_id, f_low, f_high, duration = _unpack_header(raw)
        except (struct.error, TypeError):
            raise _foreign(raw) from None
        if kind & 0xF0 != KIND:
            raise _foreign(raw)
        end = len(raw)
        if self.signer is not None:
            if not kind & SIGNED or end < HEADER_SIZE + MAC_SIZE:
                raise CorruptEntryError(_UNSIGNED)
            if self._verified.get(name) != raw:  # a comparison with public bytes: no secret to time
                self._verify(name, raw, kind)
            end -= MAC_SIZE
        elif kind & SIGNED:
            raise CorruptEntryError(_SIGNED)
        fresh = f_low | f_high << 32
        fresh_until = 0.0 if kind & STALE else FOREVER if fresh == NEVER else fresh / 1000
        if kind & TAGGED:
            namespace, tags, payload_at = read_block(raw, HEADER_SIZE)
            if payload_at > end:
                raise CorruptEntryError("tag block does not decode: it runs into the signature")
            # Judged before the payload is decoded: a deleted entry costs no unpickling.
            fresh_until = self._judged(fresh_until, namespace, tags, strict, tracked)
        else:
            payload_at = HEADER_SIZE
            if self.tags is not None:
                fresh_until = self._judged(fresh_until, 0, (), strict, tracked)
        value = self._payload(raw, kind, codec_id, payload_at, end)
        return _entry(Entry, (value, fresh_until, (c_low | c_high << 32) / 1000, duration))

    def loadable(self, raw: bytes) -> tuple[Any, Callable[[Any], Any], float] | None:
        """What a hit on ``raw``, already decoded and judged fresh, needs to
        load a value of its own again: the payload (verified, inflated), the
        function that loads it, and when it goes stale; ``None`` for a value
        that is stale or cannot be read so."""
        try:
            kind, _, _, codec_id, f_low, f_high, _ = _unpack_header(raw)
            if kind & STALE or kind & 0xF0 != KIND or (kind & SIGNED) != (self.signer is not None):
                return None
            payload_at = read_block(raw, HEADER_SIZE)[2] if kind & TAGGED else HEADER_SIZE
            end = len(raw) - (MAC_SIZE if kind & SIGNED else 0)
            fresh = f_low | f_high << 32
            fresh_until = FOREVER if fresh == NEVER else fresh / 1000
            if codec_id == INT_CODEC:
                return self._payload(raw, kind, codec_id, payload_at, end), _same, fresh_until
            if codec_id != self.serializer.codec_id:
                return None
            payload = raw[payload_at:end]
            if kind & COMPRESSED:
                payload = inflated(payload)
        except (struct.error, CorruptEntryError, ValueError, zlib.error):
            return None
        return payload, self._loads, fresh_until

    @staticmethod
    def recorded(raw: Any) -> tuple[bytes, ...]:
        """The tag ids whose state judges ``raw`` (the namespace's, ``b""``,
        first), read from its header alone: nothing verified or decoded."""
        if not isinstance(raw, bytes) or len(raw) < HEADER_SIZE or raw[0] & 0xF0 != KIND:
            return ()
        if raw[0] & TAGGED:
            try:
                _, tags, _ = read_block(raw, HEADER_SIZE)
            except CorruptEntryError:
                return ()
            return (b"", *(tag for tag, _ in tags))
        return (b"",)

    def _payload(self, raw: bytes, kind: int, codec_id: int, at: int, end: int) -> Any:
        if codec_id == INT_CODEC:
            if kind & SIGNED:
                return int.from_bytes(raw[at:end], "little", signed=True)
            try:
                return int(raw[at:end])
            except ValueError as exc:
                raise CorruptEntryError(f"integer payload does not decode: {exc}") from exc
        serializer = self.serializer
        if codec_id != serializer.codec_id:
            raise CorruptEntryError(
                f"written by serializer codec {codec_id}, this one reads codec {serializer.codec_id}"
            )
        # A memoryview avoids copying a large payload; a small one is quicker to copy.
        payload: bytes | memoryview = raw[at:end] if end < _COPY_BELOW else memoryview(raw)[at:end]
        try:
            if kind & COMPRESSED:
                payload = inflated(payload)
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


def _same(value: Any) -> Any:
    return value  # an int: immutable, so every caller may share it


def inflated(payload: bytes | memoryview) -> bytes:
    """A compressed payload inflated, refusing one larger than :data:`MAX_INFLATED`."""
    inflater = zlib.decompressobj()
    plain = inflater.decompress(payload, MAX_INFLATED)
    if inflater.unconsumed_tail or not inflater.eof:
        raise ValueError(f"compressed payload larger than {MAX_INFLATED} bytes, or truncated")
    return plain


def encode(
    serializer: Serializer,
    value: Any,
    *,
    fresh_until: float,
    created_at: float,
    duration: float,
) -> bytes:
    """An unsigned, uncompressed envelope of ``value``; the serializer's errors propagate."""
    return Codec(serializer).encode(
        b"", value, fresh_until=fresh_until, created_at=created_at, duration=duration
    )


def decode(serializer: Serializer, raw: bytes) -> Entry:
    """Decode an unsigned envelope, raising :class:`CorruptEntryError` for anything foreign."""
    return Codec(serializer).decode(b"", raw)


#: What Codec keeps of the bytes it verified: values up to 16 KiB, of up to
#: 4096 keys, 8 MiB in all (a bound on memory, not on correctness).
_VERIFIED_LARGEST = 16 * 1024
_VERIFIED_KEYS = 4096
_VERIFIED_BYTES = 8 * 1024 * 1024


def _name_part(name: bytes) -> bytes:
    # Length first: no two (key, value) pairs sign the same bytes.
    return struct.pack("<I", len(name)) + name
