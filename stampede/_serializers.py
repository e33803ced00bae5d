"""Pluggable serializers for cached values."""

from __future__ import annotations

import importlib
import json
import pickle
from typing import Any, Protocol, runtime_checkable

from ._exceptions import ConfigurationError

__all__ = ["JsonSerializer", "PickleSerializer", "Serializer", "serializer_from"]


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

    Only use it on a Redis that untrusted parties cannot write to: unpickling
    data from an attacker runs the attacker's code.
    """

    codec_id = 1

    def __init__(self, protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
        self.protocol = protocol

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, self.protocol)

    def loads(self, data: bytes | memoryview) -> Any:
        return pickle.loads(data)

    def __repr__(self) -> str:
        return f"PickleSerializer(protocol={self.protocol})"


class JsonSerializer:
    """JSON values only (dict, list, str, int, float, bool, None); safe to share."""

    codec_id = 2

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()

    def loads(self, data: bytes | memoryview) -> Any:
        return json.loads(bytes(data))

    def __repr__(self) -> str:
        return "JsonSerializer()"


_NAMED: dict[str, type[Serializer]] = {"pickle": PickleSerializer, "json": JsonSerializer}


def serializer_from(setting: Any) -> Serializer:
    """A serializer from a setting: ``"pickle"``, ``"json"``, the dotted path
    of a class or instance, a class, or an instance. For configuration files."""
    value = setting
    if isinstance(value, str):
        if value.lower() in _NAMED:
            value = _NAMED[value.lower()]
        else:
            module, _, name = value.rpartition(".")
            try:
                value = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError, ValueError) as exc:
                raise ConfigurationError(f"serializer {setting!r} cannot be imported: {exc}") from exc
    if isinstance(value, type):
        value = value()
    if not isinstance(value, Serializer):
        raise ConfigurationError(
            f"serializer must be 'pickle', 'json' or a stampede serializer, got {setting!r}"
        )
    return value
