"""An instance's settings and what follows from them without I/O."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from .._exceptions import ConfigurationError
from .clock import Clock, SystemClock
from .codec import Codec
from .events import Event, EventHook, EventKind, logger
from .judging import Judge
from .keys import Keys, KeySpace
from .near import NearCache, NearStore
from .options import UNSET, Options
from .serializers import PickleSerializer, Serializer
from .signing import signer_from
from .tags import TagStates, tag_ids

__all__ = ["Settings"]

_CALL_FIELDS = ("ttl", "stale_ttl", "lease_ttl", "wait_timeout", "background", "beta")
_ALL_UNSET = (UNSET,) * len(_CALL_FIELDS)


class Settings:
    """An instance's settings, checked, and what follows from them without I/O:
    key names, each call's options, encoding and decoding, events."""

    def __init__(
        self,
        *,
        namespace: str = "stampede",
        options: Options | None = None,
        serializer: Serializer | None = None,
        signing_key: Any = None,
        near_cache: Any = None,
        on_event: EventHook | None = None,
        clock: Clock | None = None,
        tag_check_interval: float = 0.1,
        compress_above: int | None = 1024,
        option_values: Mapping[str, Any] | None = None,
    ) -> None:
        base = options if options is not None else Options()
        if not isinstance(base, Options):
            raise ConfigurationError(f"options must be a stampede.Options, got {base!r}", field="options")
        if option_values:
            base = Options.from_mapping({**dataclasses.asdict(base), **option_values}, "Stampede()")
        serializer = serializer if serializer is not None else PickleSerializer()
        if isinstance(serializer, str):
            raise ConfigurationError(
                f"serializer={serializer!r} is a name, and Stampede() takes a serializer object: "
                f"serializer=stampede.serializer_from({serializer!r}) reads the name",
                field="serializer",
            )
        if not isinstance(serializer, Serializer):
            raise ConfigurationError(
                f"serializer must have codec_id, dumps and loads, got {serializer!r}", field="serializer"
            )
        codec_id = serializer.codec_id
        if isinstance(codec_id, bool) or not isinstance(codec_id, int) or not 1 <= codec_id <= 255:
            raise ConfigurationError(
                f"serializer.codec_id must be an int in 1..255, got {codec_id!r}", field="serializer"
            )
        if compress_above is not None and (
            isinstance(compress_above, bool) or not isinstance(compress_above, int) or compress_above < 0
        ):
            raise ConfigurationError(
                f"compress_above must be a number of bytes (an int >= 0) or None, got {compress_above!r}",
                field="compress_above",
            )
        if on_event is not None and not callable(on_event):
            raise ConfigurationError(f"on_event must be callable, got {on_event!r}", field="on_event")
        #: Names this instance's keys in Redis.
        self.keys = KeySpace(namespace)
        self.options = base
        self._merged: dict[tuple[Any, ...], Options] = {}
        self.serializer = serializer
        #: The tag states this process read lately (see ``stampede._core.tags``).
        self.tags = TagStates(self.keys.prefix, tag_check_interval)
        self._tag_ids: dict[Any, tuple[bytes, ...]] = {}
        self.codec = Codec(serializer, signer_from(signing_key), self.tags, compress_above)
        if type(near_cache) is int and near_cache < 1:
            # from_setting() reads 0 as "off", as the framework settings do;
            # given to Stampede() itself, it is more likely a size gone wrong.
            raise ConfigurationError(
                f"near_cache={near_cache!r} is not a number of entries a near cache can keep (1 or "
                "more): near_cache takes None or False (no near cache, the default: leave it out), "
                "True (a near cache with the default bounds), a number of entries >= 1, or a "
                "stampede.NearCache",
                field="near_cache",
            )
        #: The near cache's settings, if it has one.
        self.near = NearCache.from_setting(near_cache)
        self.on_event = on_event
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._now = self.clock.time  # bound once: it is on every hit
        #: What stored bytes are to a caller (see :class:`~stampede._core.judging.Judge`).
        self.judge = Judge(self)

    # --- options, keys, events ---------------------------------------------

    def call_options(
        self,
        ttl: Any = UNSET,
        stale_ttl: Any = UNSET,
        lease_ttl: Any = UNSET,
        wait_timeout: Any = UNSET,
        background: Any = UNSET,
        beta: Any = UNSET,
    ) -> Options:
        """This instance's options with a call's overrides; memoised, as it is on the hit path."""
        values = (ttl, stale_ttl, lease_ttl, wait_timeout, background, beta)
        if values == _ALL_UNSET:
            return self.options
        memo = self._merged
        try:
            # Stored under the bare values only when none of them equals 0
            # or 1: so a bool (True == 1, and hashes alike) never finds
            # them, and ttl=True is never served what was validated for 1.
            return memo[values]
        except KeyError:
            pass
        except TypeError:  # unhashable, hence invalid: merged() says why
            return self.options.merged(self._overrides(values))
        signature = (*values, *map(type, values))  # types in the key: True is not 1
        try:
            return memo[signature]
        except KeyError:
            pass
        merged = self.options.merged(self._overrides(values))
        if len(memo) >= 256:
            memo.clear()
        memo[values if 0 not in values and 1 not in values else signature] = merged
        return merged

    @staticmethod
    def _overrides(values: tuple[Any, ...]) -> dict[str, Any]:
        return {name: value for name, value in zip(_CALL_FIELDS, values, strict=True) if value is not UNSET}

    def emit(self, keys: Keys, kind: EventKind, **details: Any) -> None:
        self.emit_named(keys.name, kind, **details)

    def emit_named(self, name: str, kind: EventKind, **details: Any) -> None:
        hook = self.on_event
        if hook is None:
            return
        try:
            hook(Event(kind, name, namespace=self.keys.namespace, **details))
        except Exception:
            # An observer must never break the cache it observes.
            logger.exception("on_event hook raised for %s on %r", kind.value, name)

    def tag_ids(self, tags: Any, argument: str = "tags") -> tuple[bytes, ...]:
        """The ids of a call's ``tags``, checked; memoised, as it is on the hit path."""
        if not tags and isinstance(tags, (tuple, list)):
            return ()
        try:
            return self._tag_ids[tags]
        except (KeyError, TypeError):
            pass
        ids = tag_ids(tags, argument)
        if isinstance(tags, tuple):
            memo = self._tag_ids
            if len(memo) >= 1024:
                memo.clear()
            memo[tags] = ids
        return ids

    @property
    def indexes_hot(self) -> bool:
        """Whether near hits may be served from the hot index: not when each may
        be drawn for early refresh (``beta``, by default)."""
        return self.near is not None and self.options.beta is None

    def near_store(self) -> NearStore | None:
        """The near cache's store, if there is one (made by the driver, which
        then has its subscriber track it)."""
        if self.near is None:
            return None
        reports = self.on_event is not None
        store = NearStore(
            self.near,
            self.keys.prefix,
            self._near_dropped if reports else None,
            self.clock.time,
            self._near_hit if reports else None,
        )
        self.tags.on_change = store.cool
        return store

    def _near_hit(self, key: Any) -> None:
        self.emit(self.keys(key), EventKind.NEAR_HIT)

    def _near_dropped(self, kind: EventKind, name: bytes) -> None:
        self.emit_named(self.keys.key_of(name) if name else "", kind)

    # --- values changed in place -----------------------------------------------

    def fresh_until(self, options: Options) -> float:
        ttl = options.ttl
        return float("inf") if ttl is None else self.clock.time() + ttl

    def retimed(self, keys: Keys, raw: bytes, options: Options) -> tuple[bytes, str]:
        """A signed ``touch``: the new value of ``keys`` and the SWAP expiry."""
        fresh_until = self.fresh_until(options)
        return self.codec.resigned(keys.value, raw, fresh_until=fresh_until), str(options.expire_ms or 0)

    def incremented(self, keys: Keys, raw: bytes, delta: int) -> tuple[bytes, int]:
        """A signed ``incr``: the new value of ``keys`` and the new integer."""
        value = self.codec.decode(keys.value, raw, False).value  # raw was verified: this is cheap
        if type(value) is not int:
            raise TypeError(f"the value of key {keys.name!r} is not an integer")
        total = value + delta
        if not -(2**63) <= total < 2**63:  # as Redis's INCRBY on unsigned values
            raise OverflowError(f"incrementing key {keys.name!r} leaves the 64-bit integer range")
        return self.codec.resigned(keys.value, raw, number=total), total

    def items(self, mapping: Mapping[Any, Any]) -> list[tuple[Keys, Any]]:
        if not isinstance(mapping, Mapping):
            raise ConfigurationError(
                f"mapping must be a Mapping of keys to values, got {mapping!r}", field="mapping"
            )
        return [(self.keys(key), value) for key, value in mapping.items()]

    def many(self, keys: Iterable[str | bytes]) -> dict[bytes, tuple[str | bytes, Keys]]:
        named: dict[bytes, tuple[str | bytes, Keys]] = {}
        for key in keys:
            names = self.keys(key)
            named[names.value] = (key, names)
        return named
