"""What an operator sees of a key: its entry, its tags and its lease, read
from the raw bytes Redis holds (no I/O here: ``stampede.cli`` reads them).

Nothing here decodes a payload: an inspection shows what the header, the
tag block and the lease record say, so that a key written by another
serializer, or signed with a key the operator does not have, is shown all
the same.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, field
from typing import Any

from .envelope import (
    COMPRESSED,
    HEADER,
    HEADER_SIZE,
    INT_CODEC,
    KIND,
    NEVER,
    OLD_FORMAT,
    SIGNED,
    STALE,
    TAGGED,
    CorruptEntryError,
    read_block,
)
from .tags import DELETED, FRESH, LOST, NAMESPACE, parse_state

__all__ = [
    "EntryReport",
    "LeaseReport",
    "TagReport",
    "inspect_entry",
    "inspect_lease",
    "is_entry",
    "recorded_tags",
]

#: The serializers stampede ships, by codec id (a compressed one: its inner's plus 128).
_CODECS = {INT_CODEC: "int", 1: "pickle", 2: "json"}
_COMPRESSED_CODEC = 128
_UNFILLED = b"!unfilled"
_FAILED = b"!failed:"


@dataclass(frozen=True)
class TagReport:
    """A tag an entry carries (``""``: the namespace) and what became of it
    since the entry's rebuild captured its state."""

    name: str
    #: The tag's version the entry recorded.
    recorded: int
    #: ``"current"`` (unchanged since), ``"invalidated"``, ``"deleted"``, or
    #: ``"lost"`` (its state is missing: the entry reads as missing).
    since: str
    #: The tag's state now, ``(current, deleted)``; ``None`` when lost.
    state: tuple[int, int] | None


@dataclass(frozen=True)
class LeaseReport:
    """What a key's lease key holds."""

    #: ``"free"``, ``"held"``, ``"lapsed"`` (its holder may still store while
    #: the record is there, with ``store_if_lapsed``), ``"unfilled"`` (a key
    #: read and never written: reads miss at once), ``"failed"`` (the last
    #: rebuild raised: nobody tries again until ``retry_in``), ``"foreign"``.
    state: str
    #: Seconds it is held for still (``held``), or before a retry (``failed``).
    remaining: float | None = None
    #: Seconds since it was won (``held``, ``lapsed``).
    held_for: float | None = None
    #: ``host:pid`` of the process that holds it, where the record says.
    holder: str | None = None
    #: ``failed``: the rebuilds that raised in a row, and the last error.
    failures: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class EntryReport:
    """What Redis holds under a key."""

    key: str
    #: ``"fresh"``, ``"stale"``, ``"missing"`` (no value, or one its tags or
    #: the namespace deleted), ``"foreign"`` (not stampede's: read as a miss).
    status: str
    #: Why the status is what it is, in words (``"invalidated by tag 'a'"``).
    because: str = ""
    bytes: int = 0
    #: When it was written (Redis's clock, epoch seconds), its age (s), until
    #: when it is fresh (``None``: never stale), how long its rebuild took.
    created_at: float | None = None
    age: float | None = None
    fresh_until: float | None = None
    rebuild_seconds: float | None = None
    #: The serializer that wrote it (``pickle``, ``json``, ``int``, ``codec 7``).
    format: str | None = None
    compressed: bool = False
    signed: bool = False
    #: Marked stale in place (``invalidate``).
    marked_stale: bool = False
    namespace: TagReport | None = None
    tags: tuple[TagReport, ...] = ()
    lease: LeaseReport = field(default_factory=lambda: LeaseReport("free"))

    def as_dict(self) -> dict[str, Any]:
        """This report as plain data (``--json``)."""
        return asdict(self)


def is_entry(head: Any) -> bool:
    """Whether bytes starting with ``head`` (one byte will do) are an entry of
    this format."""
    return isinstance(head, bytes) and len(head) >= 1 and head[0] & 0xF0 == KIND


def recorded_tags(raw: bytes | None) -> tuple[bytes, ...]:
    """The tag ids whose states judge ``raw`` (the namespace's, ``b""``,
    first), or none if it is no entry of this format."""
    head = _header(raw)
    if head is None or raw is None:
        return ()
    try:
        _, tags, _ = read_block(raw, HEADER_SIZE)
    except CorruptEntryError:
        return ()
    return (NAMESPACE, *(tag for tag, _ in tags))


def inspect_entry(
    key: str,
    raw: bytes | None,
    lease: bytes | None,
    states: dict[bytes, bytes | None],
    now: float,
    lease_pttl_ms: int = -2,
) -> EntryReport:
    """Report on ``key``: its raw value, its lease key's value (and PTTL), the
    raw states of the tags it records (by id, see :func:`recorded_tags`),
    at ``now`` (Redis's clock, epoch seconds)."""
    lease_report = inspect_lease(lease, now, lease_pttl_ms)
    if raw is None:
        return EntryReport(key, "missing", "no value", lease=lease_report)
    head = _header(raw)
    if head is None:
        because = "written by an earlier stampede" if raw[:1] == bytes([OLD_FORMAT]) else "not stampede's"
        return EntryReport(key, "foreign", because, bytes=len(raw), lease=lease_report)
    kind, created_low, created_high, codec, fresh_low, fresh_high, duration = head
    flags = kind & 0x0F
    created = (created_low | created_high << 32) / 1000
    fresh_ms = fresh_low | fresh_high << 32
    fresh_until = None if fresh_ms == NEVER else fresh_ms / 1000
    try:
        namespace, tags, _ = read_block(raw, HEADER_SIZE)
    except CorruptEntryError as exc:
        return EntryReport(key, "foreign", str(exc), bytes=len(raw), lease=lease_report)
    ns_report = _tag_report("", namespace, states.get(NAMESPACE))
    tag_reports = tuple(_tag_report(_name(tag), version, states.get(tag)) for tag, version in tags)
    status, because = _status(flags, fresh_until, now, ns_report, tag_reports)
    return EntryReport(
        key,
        status,
        because,
        bytes=len(raw),
        created_at=created,
        age=max(now - created, 0.0),
        fresh_until=fresh_until,
        rebuild_seconds=float(duration),
        format=_format(codec),
        compressed=bool(flags & COMPRESSED) or codec >= _COMPRESSED_CODEC,
        signed=bool(flags & SIGNED),
        marked_stale=bool(flags & STALE),
        namespace=ns_report,
        tags=tag_reports,
        lease=lease_report,
    )


def inspect_lease(raw: bytes | None, now: float, pttl_ms: int = -2) -> LeaseReport:
    """What a lease key holding ``raw`` (its PTTL ``pttl_ms``) means at ``now``
    (Redis's clock, epoch seconds)."""
    if raw is None:
        return LeaseReport("free")
    if raw == _UNFILLED:
        return LeaseReport("unfilled", remaining=pttl_ms / 1000 if pttl_ms > 0 else None)
    if raw.startswith(_FAILED):
        failures, _, rest = raw[len(_FAILED) :].partition(b":")
        retry_at, _, error = rest.partition(b":")
        if failures.isdigit() and retry_at.isdigit():
            return LeaseReport(
                "failed",
                remaining=max(int(retry_at) / 1000 - now, 0.0),
                failures=int(failures),
                error=error.decode("utf-8", "replace"),
            )
        return LeaseReport("foreign")
    parts = raw.split(b":", 3)
    if len(parts) >= 3 and _is_hex(parts[0]) and parts[1].isdigit() and parts[2].isdigit():
        until, won = int(parts[1]) / 1000, int(parts[2]) / 1000
        holder = parts[3].decode("utf-8", "replace") if len(parts) == 4 and parts[3] else None
        if until > now:
            return LeaseReport("held", remaining=until - now, held_for=max(now - won, 0.0), holder=holder)
        return LeaseReport("lapsed", held_for=max(now - won, 0.0), holder=holder)
    # Another writer's: held while it lives, if it expires (see the scripts).
    return LeaseReport("foreign", remaining=pttl_ms / 1000 if pttl_ms > 0 else None)


def _header(raw: bytes | None) -> tuple[int, ...] | None:
    if raw is None or len(raw) < HEADER_SIZE or raw[0] & 0xF0 != KIND:
        return None
    if raw[0] & TAGGED == 0:
        return None  # every entry of this format has its block
    try:
        return HEADER.unpack_from(raw)
    except struct.error:
        return None


def _tag_report(name: str, version: int, raw: bytes | None) -> TagReport:
    state = parse_state(raw)
    if state == LOST:
        return TagReport(name, version, "lost", None)
    current, deleted = state
    if version == current:
        since = "current"
    elif version < deleted:
        since = "deleted"
    else:
        since = "invalidated"
    return TagReport(name, version, since, state)


def _status(
    flags: int, fresh_until: float | None, now: float, namespace: TagReport, tags: tuple[TagReport, ...]
) -> tuple[str, str]:
    """The entry's status by its tags (the worst of them) and its times."""
    for report in (namespace, *tags):
        what = "the namespace" if report is namespace else f"tag {report.name!r}"
        if report.since == "lost":
            return "missing", f"the state of {what} is missing (evicted or expired): read as missing"
        if _verdict(report) == DELETED:
            return "missing", f"deleted by {what}"
    for report in (namespace, *tags):
        if _verdict(report) != FRESH:
            what = "invalidate_all" if report is namespace else f"tag {report.name!r}"
            return "stale", f"invalidated by {what}"
    if flags & STALE:
        return "stale", "marked stale (invalidate)"
    if fresh_until is not None and now >= fresh_until:
        return "stale", "past its ttl"
    return "fresh", ""


def _verdict(report: TagReport) -> int:
    return {"current": FRESH, "deleted": DELETED}.get(report.since, FRESH + 1)


def _format(codec: int) -> str:
    if codec >= _COMPRESSED_CODEC:
        inner = codec - _COMPRESSED_CODEC
        return f"{_CODECS.get(inner, f'codec {inner}')}, compressed"
    return _CODECS.get(codec, f"codec {codec}")


def _name(tag: bytes) -> str:
    """A tag's name from its id (ids escape ``%`` and ``}`` as keys do)."""
    return tag.replace(b"%7D", b"}").replace(b"%25", b"%").decode("utf-8", "surrogatepass")


def _is_hex(text: bytes) -> bool:
    return bool(text) and all(c in b"0123456789abcdefABCDEF" for c in text)
