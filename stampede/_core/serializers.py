"""Pluggable serializers for cached values."""

from __future__ import annotations

import importlib
import json
import pickle
import struct
import zlib
from typing import Any, Protocol, runtime_checkable

from .._exceptions import ConfigurationError

__all__ = ["Compressed", "JsonSerializer", "PickleSerializer", "Serializer", "serializer_from"]


@runtime_checkable
class Serializer(Protocol):
    """Turns values into bytes and back.

    ``codec_id`` (1-255) is stored with every value, so that data written by
    a different serializer is recognised as a miss instead of misread.
    """

    codec_id: int

    def dumps(self, value: Any) -> bytes:
        """Encode ``value``; raise any exception if it cannot be encoded."""
        ...

    def loads(self, data: bytes | memoryview) -> Any:
        """Decode what :meth:`dumps` produced."""
        ...


class PickleSerializer:
    """The default: any picklable value.

    Stores the pickle without its first 2 to 11 bytes, the protocol and frame
    opcodes, which the unpickler does not need (they announce the protocol
    and the length of what follows, both implied here): on a small value,
    that is a tenth of it. Reads whole pickles as well.

    Only use it on a Redis that untrusted parties cannot write to: unpickling
    data from an attacker runs the attacker's code.
    """

    codec_id = 1

    def __init__(self, protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
        self.protocol = protocol

    def dumps(self, value: Any) -> bytes:
        data = pickle.dumps(value, self.protocol)
        if data[:1] != _PROTO:
            return data  # protocol 0 or 1: nothing to leave out
        if data[2:3] == _FRAME and _FRAME_LENGTH.unpack_from(data, 3)[0] == len(data) - 11:
            return data[11:]  # one frame, all of it
        if data[2:3] != _FRAME:
            return data[2:]
        return data

    def loads(self, data: bytes | memoryview) -> Any:
        return pickle.loads(data)

    def __repr__(self) -> str:
        return f"PickleSerializer(protocol={self.protocol})"


_PROTO = b"\x80"
_FRAME = b"\x95"
_FRAME_LENGTH = struct.Struct("<Q")


class JsonSerializer:
    """JSON values only (dict, list, str, int, float, bool, None); safe to share."""

    codec_id = 2

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()

    def loads(self, data: bytes | memoryview) -> Any:
        return json.loads(bytes(data))

    def __repr__(self) -> str:
        return "JsonSerializer()"


def _zstd() -> Any:
    """A zstd module with ``compress`` and ``decompress``: the standard
    library's (Python 3.14+), else the ``zstandard`` package (the ``zstd``
    extra), else ``None``."""
    for name in ("compression.zstd", "zstandard"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


#: The first byte of a compressed payload: how the rest is stored.
_STORED, _ZLIB, _ZSTD = 0, 1, 2
_ALGORITHMS = {"zlib": _ZLIB, "zstd": _ZSTD}


class Compressed:
    """Another serializer's output, compressed when it is large.

    ``Compressed(JsonSerializer(), "zlib")``: payloads of ``min_size`` bytes
    or more are compressed with ``algorithm``, ``"zlib"`` (the standard
    library) or ``"zstd"`` (Python 3.14's, or the ``zstandard`` package: the
    ``zstd`` extra); smaller ones, and any that would not shrink, are stored
    as they are. Either algorithm's payloads are read by any ``Compressed``
    of the same serializer, so a fleet can switch algorithms gradually.
    Decompression stops at ``max_size`` bytes: a payload that would grow
    larger is unreadable (a miss), never a memory bomb.

    Its ``codec_id`` is the wrapped serializer's plus 128, so values written
    with and without compression never misread each other.
    """

    def __init__(
        self,
        serializer: Serializer | None = None,
        algorithm: str = "zlib",
        *,
        level: int | None = None,
        min_size: int = 1024,
        max_size: int = 512 * 1024 * 1024,
    ) -> None:
        inner = serializer if serializer is not None else PickleSerializer()
        if not isinstance(inner, Serializer) or isinstance(inner, Compressed):
            raise ConfigurationError(
                f"Compressed needs a serializer to wrap, got {serializer!r}", field="serializer"
            )
        if not 1 <= inner.codec_id < 128:
            raise ConfigurationError(
                f"Compressed wraps serializers whose codec_id is 1..127, got {inner.codec_id!r}",
                field="serializer",
            )
        if algorithm not in _ALGORITHMS:
            raise ConfigurationError(
                f"algorithm must be 'zlib' or 'zstd', got {algorithm!r}", field="algorithm"
            )
        if algorithm == "zstd" and _zstd() is None:
            raise ConfigurationError(
                "algorithm 'zstd' needs Python 3.14+ or the zstandard package "
                "(pip install 'redis-stampede[zstd]')",
                field="algorithm",
            )
        for name, number in (("min_size", min_size), ("max_size", max_size)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise ConfigurationError(f"{name} must be an int >= 0, got {number!r}", field=name)
        if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
            raise ConfigurationError(f"level must be an int or None, got {level!r}", field="level")
        self.serializer = inner
        self.algorithm = algorithm
        self.level = level
        self.min_size = min_size
        self.max_size = max_size
        self.codec_id = inner.codec_id + 128

    def dumps(self, value: Any) -> bytes:
        data = self.serializer.dumps(value)
        if len(data) >= self.min_size:
            if self.algorithm == "zlib":
                packed = zlib.compress(data, -1 if self.level is None else self.level)
            else:
                zstd = _zstd()
                packed = zstd.compress(data) if self.level is None else zstd.compress(data, self.level)
            if len(packed) < len(data):
                return bytes([_ALGORITHMS[self.algorithm]]) + packed
        return bytes([_STORED]) + data

    def loads(self, data: bytes | memoryview) -> Any:
        kind, body = data[0], data[1:]
        if kind == _STORED:
            return self.serializer.loads(body)
        if kind == _ZLIB:
            inflater = zlib.decompressobj()
            plain = inflater.decompress(body, self.max_size)
            if inflater.unconsumed_tail or not inflater.eof:
                raise ValueError(f"zlib payload larger than max_size ({self.max_size} bytes) or truncated")
            return self.serializer.loads(plain)
        if kind == _ZSTD:
            return self.serializer.loads(self._unzstd(bytes(body)))
        raise ValueError(f"unknown compression {kind}")

    def _unzstd(self, body: bytes) -> bytes:
        zstd = _zstd()
        if zstd is None:
            raise ValueError("zstd payload, and no zstd here (Python 3.14+ or the zstandard package)")
        if hasattr(zstd.ZstdDecompressor, "stream_reader"):  # the zstandard package
            with zstd.ZstdDecompressor().stream_reader(body) as reader:
                plain = reader.read(self.max_size + 1)
        else:  # the standard library's
            plain = zstd.ZstdDecompressor().decompress(body, self.max_size + 1)
        if len(plain) > self.max_size:
            raise ValueError(f"zstd payload larger than max_size ({self.max_size} bytes)")
        return bytes(plain)

    def __repr__(self) -> str:
        return f"Compressed({self.serializer!r}, {self.algorithm!r}, min_size={self.min_size})"


_NAMED: dict[str, type[Serializer]] = {"pickle": PickleSerializer, "json": JsonSerializer}
#: What a serializer setting may be, for messages.
_ACCEPTED = (
    "'pickle', 'json', either compressed ('pickle+zlib', 'json+zlib', 'pickle+zstd', 'json+zstd'), "
    "or the dotted path of a stampede serializer class or instance (such as "
    "'myapp.serializers.MsgpackSerializer')"
)


def serializer_from(setting: Any) -> Serializer:
    """A serializer from a setting: ``"pickle"``, ``"json"``, either compressed
    (``"json+zlib"``, ``"pickle+zstd"``: see :class:`Compressed`), the dotted
    path of a class or instance, a class, or an instance. For configuration files."""
    value = setting
    if isinstance(value, str) and "+" in value:
        # "json+zlib", "pickle+zstd": a named serializer, compressed.
        name, _, algorithm = value.lower().partition("+")
        if name not in _NAMED:
            raise ConfigurationError(
                f"serializer {setting!r}: {name!r} is not 'pickle' or 'json'; use {_ACCEPTED}",
                field="serializer",
            )
        if algorithm not in _ALGORITHMS:
            raise ConfigurationError(
                f"serializer {setting!r}: the algorithm must be 'zlib' or 'zstd', got {algorithm!r}",
                field="serializer",
            )
        try:
            return Compressed(_NAMED[name](), algorithm)
        except ConfigurationError as exc:  # zstd missing: the setting asks for what is not here
            exc.field = "serializer"
            raise
    if isinstance(value, str):
        if value.lower() in _NAMED:
            value = _NAMED[value.lower()]
        elif not all(part.isidentifier() for part in value.split(".")) or "." not in value:
            raise ConfigurationError(
                f"serializer {setting!r} is not a name stampede knows: use {_ACCEPTED}", field="serializer"
            )
        else:
            module, _, name = value.rpartition(".")
            try:
                value = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError, ValueError) as exc:
                raise ConfigurationError(
                    f"serializer {setting!r} cannot be imported ({exc}): use {_ACCEPTED}", field="serializer"
                ) from exc
    if isinstance(value, type):
        value = value()
    if not isinstance(value, Serializer):
        raise ConfigurationError(
            f"serializer must be {_ACCEPTED}, a class or an instance, got {setting!r}", field="serializer"
        )
    return value
