"""Redis key names for a cache key: the value, its lease, its wake-up channel."""

from __future__ import annotations

import re

from .._exceptions import ConfigurationError, KeyTypeError

__all__ = ["KeySpace", "Keys"]

_MAX_KEY_BYTES = 64 * 1024
#: How many made Keys are kept, and for keys of how many characters at most:
#: a bounded memory cost (about 1 MB) for the keys that make up a hot set.
_MADE_AT_MOST = 4096
_MADE_KEY_LENGTH = 200


class Keys:
    """The Redis names used for one cache key.

    The value's name is ``<namespace>:{<key>``, without a hash tag (the key is
    escaped to hold no ``}``), so a cluster places it by all of its name. Its
    lease, scratch key and channel are ``<namespace>:{<value's name>}:...``:
    their hash tag is the value's whole name, so they share its slot and the
    scripts that touch them all run on Redis Cluster. Built on every call, so
    only the value's name is made up front: a hit needs nothing else.
    """

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: bytes) -> None:
        self.name = name  # the key as the caller gave it, for messages and events
        self.value = value

    def _beside(self, suffix: bytes) -> bytes:
        value = self.value
        # The namespace holds no brace: the first one ends the prefix.
        return value[: value.index(b"{") + 1] + value + suffix

    @property
    def lease(self) -> bytes:
        return self._beside(b"}:lease")

    @property
    def channel(self) -> bytes:
        return self._beside(b"}:ch")

    @property
    def script_keys(self) -> list[bytes]:
        """The keys every script is given, in the order the scripts expect."""
        return [self.value, self.lease, self.scratch]

    @property
    def scratch(self) -> bytes:
        """A key for a script's temporary arithmetic, in the same slot."""
        return self._beside(b"}:tmp")

    def __repr__(self) -> str:
        return f"Keys({self.name!r}, {self.value!r})"


def _escape(raw: bytes) -> bytes:
    """``raw`` with ``%`` and ``}`` escaped (``%25``, ``%7D``), so that a value's
    name holds no ``}`` (no hash tag) and every other name of the namespace
    does: no two keys, and no key and another's lease, ever share a
    name. A prefix of a key escapes to a prefix of the key's escape."""
    if b"}" in raw or b"%" in raw:
        return raw.replace(b"%", b"%25").replace(b"}", b"%7D")
    return raw


def _glob_escape(raw: bytes) -> bytes:
    return re.sub(rb"([*?\[\]\\])", rb"\\\1", raw)


class KeySpace:
    """Builds :class:`Keys` under a namespace, validating user keys."""

    __slots__ = ("_made", "_prefix", "namespace", "pattern")

    def __init__(self, namespace: str) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise ConfigurationError(
                f"namespace must be a non-empty str, got {namespace!r}", field="namespace"
            )
        if "{" in namespace or "}" in namespace:
            # Braces would move the hash tag out of the user's key.
            raise ConfigurationError(
                f"namespace must not contain '{{' or '}}': {namespace!r}", field="namespace"
            )
        self.namespace = namespace
        self._prefix = namespace.encode() + b":{"
        # Keys already made, by the caller's key: a hit is one GET, and building
        # its names again (encode, concatenate, allocate) was a tenth of it.
        self._made: dict[str | bytes, Keys] = {}
        # SCAN pattern for every key of this namespace (and no other: "app" is
        # not "app:tenant2", whose keys start "app:tenant2:{"), globs escaped.
        self.pattern = _glob_escape(self._prefix) + b"*"

    @property
    def prefix(self) -> bytes:
        """What every name of this namespace's keys starts with: ``<namespace>:{``."""
        return self._prefix

    def key_of(self, value: bytes) -> str:
        """The cache key whose value is named ``value`` (for display)."""
        raw = value[len(self._prefix) :]
        if b"%" in raw:
            raw = raw.replace(b"%7D", b"}").replace(b"%25", b"%")
        return raw.decode("utf-8", "backslashreplace")

    def value_prefix(self, prefix: str) -> bytes:
        """What the names of the values of every key starting with ``prefix`` start with."""
        return self._prefix + _escape(prefix.encode("utf-8", "surrogatepass"))

    def prefix_patterns(self, prefix: str) -> tuple[bytes, bytes]:
        """SCAN patterns for the values of every key starting with ``prefix``,
        and for their leases and scratch keys."""
        under = self.value_prefix(prefix)
        return _glob_escape(under) + b"*", _glob_escape(self._prefix + under) + b"*"

    def __call__(self, key: str | bytes) -> Keys:
        if type(key) is str or type(key) is bytes:
            known = self._made.get(key)
            if known is not None:
                return known
        keys = self._make(key)
        if len(key) <= _MADE_KEY_LENGTH:
            made = self._made
            if len(made) >= _MADE_AT_MOST:
                made.clear()  # simpler than an LRU, and as good for a hot set that fits
            made[key] = keys
        return keys

    def _make(self, key: str | bytes) -> Keys:
        if isinstance(key, str):
            raw = key.encode("utf-8", "surrogatepass")
            name = key
        elif isinstance(key, bytes):
            raw = key
            name = key.decode("utf-8", "backslashreplace")
        else:
            raise KeyTypeError(f"key must be str or bytes, got {type(key).__name__} {key!r}", field="key")
        if not raw:
            raise ConfigurationError("key must not be empty", field="key")
        if len(raw) > _MAX_KEY_BYTES:
            raise ConfigurationError(
                f"key is {len(raw)} bytes long; the limit is {_MAX_KEY_BYTES}", field="key"
            )
        return Keys(name, self._prefix + _escape(raw))
