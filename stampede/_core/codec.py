"""How one instance writes and reads envelopes (see :mod:`~stampede._core.envelope`
for their layout): its serializer, its signer, the tag states it judges by."""

from __future__ import annotations

import math
import pickle
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any

from .._exceptions import SerializationError
from .envelope import (
    CODEC_AT,
    COMPRESSED,
    FOREVER,
    HEADER,
    HEADER_SIZE,
    INT_CODEC,
    KIND,
    MAC_SIZE,
    NEVER,
    OLD_FORMAT,
    SIGNED,
    STALE,
    TAGGED,
    CorruptEntryError,
    Dropped,
    Entry,
    header,
    inflated,
    milliseconds,
    pack_header,
    read_block,
    tag_block,
)
from .keys import Keys
from .options import Options
from .serializers import PickleSerializer, Serializer
from .signing import Signer
from .tags import DELETED, FRESH, UNTAGGED, Captured, TagStates

__all__ = ["NOT_PLAIN", "Codec", "decode", "encode", "envelope_of"]

#: What Codec.plain_value returns for anything but the common case.
NOT_PLAIN: Any = object()

_BYTE = [bytes((n,)) for n in range(256)]
_COPY_BELOW = 16 * 1024
_NOT_STALE = 0xFF ^ STALE
#: Builds an Entry from a tuple without NamedTuple's Python-level __new__.
_entry = tuple.__new__
_monotonic = time.monotonic
_unpack_header = HEADER.unpack_from


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
    if isinstance(raw, (bytes, bytearray, memoryview)) and raw[:1] == bytes((OLD_FORMAT,)):
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
            fresh, kind = milliseconds(fresh_until), kind & _NOT_STALE
        body = (
            pack_header(kind, c_low, c_high, codec_id, fresh & 0xFFFFFFFF, fresh >> 32, duration)
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


def encode(
    serializer: Serializer,
    value: Any,
    *,
    fresh_until: float,
    created_at: float,
    duration: float,
    namespace: int = 0,
) -> bytes:
    """An unsigned envelope of ``value`` recording the namespace's version
    ``namespace`` (0: none, which reads as missing wherever the namespace has
    a state); the serializer's errors propagate."""
    return Codec(serializer).encode(
        b"",
        value,
        fresh_until=fresh_until,
        created_at=created_at,
        duration=duration,
        captured=Captured(namespace),
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


def envelope_of(
    codec: Codec,
    keys: Keys,
    value: Any,
    options: Options,
    *,
    now: float,
    duration: float,
    captured: Captured = UNTAGGED,
) -> bytes:
    """The envelope of ``value`` for ``keys`` under ``options`` (its ``ttl``),
    refused with :class:`SerializationError` when the serializer fails or it is
    larger than ``max_value_size`` (before it is sent: Redis would take the
    whole of it over the wire, then refuse it)."""
    ttl = options.ttl
    try:
        data = codec.encode(
            keys.value,
            value,
            fresh_until=math.inf if ttl is None else now + ttl,
            created_at=now,
            duration=duration,
            captured=captured,
        )
    except Exception as exc:
        error = SerializationError(
            f"cannot serialize the value for key {keys.name!r} with {codec.serializer!r}: {exc}",
            key=keys.name,
        )
        error.__cause__ = exc
        raise error from exc
    limit = options.max_value_size
    if limit is not None and len(data) > limit:
        raise SerializationError(
            f"the value for key {keys.name!r} is {len(data)} bytes once serialized; max_value_size "
            f"is {limit} (raise it, or set it to None for no limit but Redis's)",
            key=keys.name,
        )
    return data
