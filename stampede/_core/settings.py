"""An instance's settings and what follows from them without I/O."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from .._exceptions import ConfigurationError
from .clock import Clock, SystemClock
from .codec import Codec
from .envelope import (
    HEADER_SIZE,
    KIND,
    TAGGED,
    CorruptEntryError,
    Dropped,
    Entry,
    read_block,
)
from .events import Event, EventHook, EventKind, logger
from .keys import Keys, KeySpace
from .near import Copy, NearCache, NearStore
from .ops import Lookup
from .options import UNSET, Options
from .serializers import PickleSerializer, Serializer
from .signing import signer_from
from .tags import DELETED, TagStates, TagsUnknown, tag_ids

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
            raise ConfigurationError(f"options must be a stampede.Options, got {base!r}")
        if option_values:
            base = Options.from_mapping({**dataclasses.asdict(base), **option_values}, "Stampede()")
        serializer = serializer if serializer is not None else PickleSerializer()
        if isinstance(serializer, str):
            raise ConfigurationError(
                f"serializer={serializer!r} is a name, and Stampede() takes a serializer object: "
                f"serializer=stampede.serializer_from({serializer!r}) reads the name"
            )
        if not isinstance(serializer, Serializer):
            raise ConfigurationError(f"serializer must have codec_id, dumps and loads, got {serializer!r}")
        codec_id = serializer.codec_id
        if isinstance(codec_id, bool) or not isinstance(codec_id, int) or not 1 <= codec_id <= 255:
            raise ConfigurationError(f"serializer.codec_id must be an int in 1..255, got {codec_id!r}")
        if compress_above is not None and (
            isinstance(compress_above, bool) or not isinstance(compress_above, int) or compress_above < 0
        ):
            raise ConfigurationError(
                f"compress_above must be a number of bytes (an int >= 0) or None, got {compress_above!r}"
            )
        if on_event is not None and not callable(on_event):
            raise ConfigurationError(f"on_event must be callable, got {on_event!r}")
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
                "stampede.NearCache"
            )
        #: The near cache's settings, if it has one.
        self.near = NearCache.from_setting(near_cache)
        self._decode_raw = self.codec.decode  # bound once: it is on every hit
        self.on_event = on_event
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._now = self.clock.time  # bound once: it is on every hit

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

    # --- reading ------------------------------------------------------------

    def decode(self, keys: Keys, raw: bytes | None) -> Entry | None:
        """The entry ``raw`` holds, ``None`` when missing, unreadable (logged,
        reported) or deleted with a tag. Tags whose state was not read lately
        count as unchanged: for values that just landed, and reads that
        fetched the states they lacked."""
        if raw is None:
            return None
        try:
            return self._decode_raw(keys.value, raw, False)
        except Dropped:
            return None
        except CorruptEntryError as exc:
            logger.warning("ignoring unreadable data under key %r: %s", keys.name, exc)
            self.emit(keys, EventKind.CORRUPT)
            return None

    def lookup(self, keys: Keys, raw: bytes | None, options: Options) -> Entry | Lookup | TagsUnknown:
        """What a first read found: the fresh :class:`Entry` to serve (a hit), or
        what the flow needs, or the tag states to read first. On every hit, so
        the common case comes first."""
        if raw is not None:
            try:
                entry = self._decode_raw(keys.value, raw)
            except TagsUnknown as unknown:
                return unknown
            except Dropped:
                return Lookup(None)
            except CorruptEntryError:
                return Lookup(self.decode(keys, raw))  # logs and reports it
            if self.is_hit(keys, entry, options):
                return entry
            return Lookup(entry)
        return Lookup(None)

    def judged(self, keys: Keys, raw: bytes | None, options: Options) -> Entry | Lookup:
        """:meth:`lookup` once the tag states it lacked were read."""
        entry = self.decode(keys, raw)
        if entry is not None and self.is_hit(keys, entry, options):
            return entry
        return Lookup(entry)

    def deleted_by_tags(self, head: Any) -> bool:
        """Whether a value whose header (and tag block) is ``head`` carries a
        tag deleted since it was written (by the tag states known)."""
        if not isinstance(head, bytes) or len(head) < HEADER_SIZE or head[0] & 0xF0 != KIND:
            return False
        if not head[0] & TAGGED:
            return False
        try:
            namespace, tags, _ = read_block(head, HEADER_SIZE)
        except CorruptEntryError:
            return False
        return self.tags.verdict(namespace, tags, strict=False) == DELETED

    def tags_unknown(self, *raws: Any) -> list[bytes]:
        """The tag ids, among those ``raws`` record, whose state was not read lately."""
        recorded: dict[bytes, None] = {}
        for raw in raws:
            recorded.update(dict.fromkeys(self.codec.recorded(raw)))
        return self.tags.missing(recorded)

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

    def near_lookup(self, keys: Keys, raw: bytes, options: Options) -> Entry | Lookup | TagsUnknown | None:
        """What a near copy holds: the :class:`Entry` to serve (a hit, see
        :meth:`_is_hit`), or, stale or drawn for early refresh, the
        :class:`Lookup` the flow starts from, as from a ``GET`` (Redis holds
        the same: the copy would have been dropped otherwise). So while
        another caller refreshes the key, the stale value is served from the
        process. ``None``: unreadable, read it from Redis."""
        try:
            entry = self._decode_raw(keys.value, raw, True, True)  # the link was just found quiet
        except TagsUnknown as unknown:
            return unknown
        except (CorruptEntryError, Dropped):
            return None  # Redis holds it too: the read there reports it
        now = self._now()
        if now < entry.fresh_until and (
            options.beta is None or not entry.wants_early_refresh(now, options.beta)
        ):
            if self.on_event is not None:
                self.emit(keys, EventKind.NEAR_HIT)
            return entry
        return Lookup(entry)

    def hot_copy(self, raw: bytes) -> Copy | None:
        """A near copy just served as a fresh hit, made ready for the hot index."""
        loadable = self.codec.loadable(raw)
        return None if loadable is None else Copy(raw, *loadable)

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

    def is_hit(self, keys: Keys, entry: Entry, options: Options) -> bool:
        """Whether ``entry`` is served as it is: fresh, and not drawn for early refresh."""
        now = self._now()
        if now < entry.fresh_until and (
            options.beta is None or not entry.wants_early_refresh(now, options.beta)
        ):
            if self.on_event is not None:
                self.emit(keys, EventKind.HIT)
            return True
        return False

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
            raise ConfigurationError(f"mapping must be a Mapping of keys to values, got {mapping!r}")
        return [(self.keys(key), value) for key, value in mapping.items()]

    def many(self, keys: Iterable[str | bytes]) -> dict[bytes, tuple[str | bytes, Keys]]:
        named: dict[bytes, tuple[str | bytes, Keys]] = {}
        for key in keys:
            names = self.keys(key)
            named[names.value] = (key, names)
        return named

    def found_many(
        self, named: dict[bytes, tuple[str | bytes, Keys]], raws: list[Any], *, strict: bool = True
    ) -> tuple[dict[Any, Any], dict[bytes, None]]:
        """The values ``raws`` hold by caller's key, and (``strict``) the ids of
        the tags whose states are needed to judge the others (read them, then
        call again not ``strict``)."""
        found = {}
        unknown: dict[bytes, None] = {}
        for (key, names), raw in zip(named.values(), raws, strict=True):
            if not isinstance(raw, bytes):
                continue
            if strict:
                try:
                    found[key] = self._decode_raw(names.value, raw).value
                except TagsUnknown as needed:
                    unknown.update(dict.fromkeys(needed.ids))
                except (CorruptEntryError, Dropped):
                    entry = self.decode(names, raw)  # logs and reports what is corrupt
                    if entry is not None:
                        found[key] = entry.value
                continue
            entry = self.decode(names, raw)
            if entry is not None:
                found[key] = entry.value
        return found, unknown
