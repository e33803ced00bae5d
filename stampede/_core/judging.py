"""What stored bytes are to a caller: an entry or a miss, a hit or a value to
refresh, judged by its freshness and by the states of the tags it carries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .envelope import HEADER_SIZE, KIND, TAGGED, CorruptEntryError, Dropped, Entry, read_block
from .events import EventKind, logger
from .keys import Keys
from .near import Copy
from .ops import Lookup
from .options import Options
from .tags import DELETED, TagsUnknown

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["Judge"]


class Judge:
    """Decodes and judges what an instance reads (its settings' codec, tag
    states, clock), reporting what is unreadable."""

    def __init__(self, settings: Settings) -> None:
        self.codec = settings.codec
        self.tags = settings.tags
        self.emit = settings.emit
        self.on_event = settings.on_event
        self._decode_raw = settings.codec.decode  # bound once: it is on every hit
        self._now = settings.clock.time

    def decode(self, keys: Keys, raw: bytes | None) -> Entry | None:
        """The entry ``raw`` holds, ``None`` when missing, unreadable (logged,
        reported) or deleted with a tag. Tags whose state was not read lately
        count as unchanged: for callers that read the states ``raw`` lacked
        first (see :meth:`tags_unknown`), or that cannot (Redis failed)."""
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
            return self.not_hit(entry, raw, options)
        return Lookup(None)

    def judged(self, keys: Keys, raw: bytes | None, options: Options) -> Entry | Lookup:
        """:meth:`lookup` once the tag states it lacked were read."""
        entry = self.decode(keys, raw)
        if entry is None:
            return Lookup(None)
        if self.is_hit(keys, entry, options):
            return entry
        return self.not_hit(entry, raw, options)

    def not_hit(self, entry: Entry, raw: Any, options: Options) -> Lookup:
        """What the flow starts from for an entry that is no hit: the stale
        value to serve while one caller refreshes it, or, past its stale
        window (by the reader's ``stale_ttl``) and kept for ``stale_if_error``,
        a miss that falls back on it only if the rebuild fails."""
        if options.stale_if_error and self._now() >= entry.fresh_until + options.stale_ttl:
            return Lookup(None, fallback=entry, fallback_raw=raw if isinstance(raw, bytes) else None)
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
        return self.not_hit(entry, raw, options)

    def hot_copy(self, raw: bytes) -> Copy | None:
        """A near copy just served as a fresh hit, made ready for the hot index."""
        loadable = self.codec.loadable(raw)
        return None if loadable is None else Copy(raw, *loadable)

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
