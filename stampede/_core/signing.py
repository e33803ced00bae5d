"""Signing keys for values: HMAC-SHA256 truncated to 128 bits, several keys for rotation."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any

from .._exceptions import ConfigurationError

__all__ = ["TAG_SIZE", "Signer", "signer_from"]

#: Bytes of a signature: HMAC-SHA256 truncated to 128 bits, as RFC 2104 allows
#: (at least half the hash) and as common practice does; forging one still
#: takes about 2**128 tries.
TAG_SIZE = 16
#: Shorter keys are refused: a guessable key signs nothing.
_MIN_KEY_BYTES = 16


class Signer:
    """Signs with the first of its keys and accepts a signature by any of them,
    so that a new key can be rolled out before the old one is dropped."""

    __slots__ = ("_keys", "_macs")

    def __init__(self, keys: Iterable[bytes | str], *, argument: str = "keys") -> None:
        self._keys = _checked(keys, argument, "keys")
        # HMAC's keyed start state, made once: each use copies it.
        self._macs = tuple(_keyed(key) for key in self._keys)

    def sign(self, *parts: bytes | memoryview) -> bytes:
        """The tag of the concatenation of ``parts`` under the first key."""
        mac = self._macs[0].copy()
        for part in parts:
            mac.update(part)
        tag: bytes = mac.digest()[:TAG_SIZE]
        return tag

    def verify(self, tag: bytes | memoryview, *parts: bytes | memoryview) -> bool:
        """Whether ``tag`` is the signature of ``parts`` under any key, compared
        in constant time."""
        for base in self._macs:
            mac = base.copy()
            for part in parts:
                mac.update(part)
            if hmac.compare_digest(mac.digest()[:TAG_SIZE], tag):
                return True
        return False

    @property
    def keys(self) -> tuple[bytes, ...]:
        """The keys, the signing one first."""
        return self._keys

    def __repr__(self) -> str:
        return f"<Signer with {len(self._keys)} key(s)>"  # never the keys themselves


def _keyed(key: bytes) -> Any:
    """An HMAC-SHA256 object keyed with ``key``, to copy for each message.

    OpenSSL's own object where there is one: its ``copy``, ``update`` and
    ``digest`` are C calls, where those of :class:`hmac.HMAC` wrap them in
    Python, which is a third of the time a check of a small value takes."""
    try:
        import _hashlib

        return _hashlib.hmac_new(key, digestmod="sha256")
    except (ImportError, AttributeError, ValueError):
        return hmac.new(key, digestmod=hashlib.sha256)


def _checked(keys: Iterable[object], argument: str, field: str) -> tuple[bytes, ...]:
    """``keys`` as bytes, or an error naming ``argument`` (and, as data, ``field``)."""
    checked = tuple(_key_bytes(key, argument, field) for key in keys)
    if not checked:
        raise ConfigurationError(f"{argument} is empty: give at least one signing key", field=field)
    return checked


def _key_bytes(key: object, argument: str, field: str) -> bytes:
    if isinstance(key, str):
        key = key.encode("utf-8")
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise ConfigurationError(
            f"{argument} must be bytes or str, or a sequence of them, got {type(key).__name__}", field=field
        )
    key = bytes(key)
    if len(key) < _MIN_KEY_BYTES:
        raise ConfigurationError(
            f"{argument} holds a {len(key)}-byte key: a signing key must be at least "
            f"{_MIN_KEY_BYTES} bytes long (a guessable key signs nothing)",
            field=field,
        )
    return key


def signer_from(setting: Any, argument: str = "signing_key") -> Signer | None:
    """A :class:`Signer` from ``setting``: ``None`` (no signing), a key (bytes
    or str), or a sequence of keys, the first signing, all accepted.
    ``argument`` names the setting in errors, which never show a key; their
    ``field`` is ``"signing_key"`` whatever ``argument`` is."""
    if setting is None:
        return None
    if isinstance(setting, Signer):
        return setting
    if isinstance(setting, (str, bytes, bytearray, memoryview)):
        keys: list[object] = [setting]
    else:
        try:
            keys = list(setting)
        except TypeError:
            raise ConfigurationError(
                f"{argument} must be bytes or str, or a sequence of them, got {type(setting).__name__}",
                field="signing_key",
            ) from None
    return Signer(_checked(keys, argument, "signing_key"), argument=argument)
