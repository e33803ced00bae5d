"""What a request's recorded calls come to, in words: each call's outcome
(``fresh hit``, ``stale hit``, ``miss, lease won``, ``waited 12.3 ms``,
``fail-open``...), the leases the request held and what became of each, and
the verdict of a ``cache_page`` response (``HIT``, ``STALE``, ``MISS``).

Everything here is plain data (str, int, float): the debug toolbar keeps
its panels' data as JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from stampede import Event, EventKind

from ._config import CacheConfig
from ._header_lists import is_header_key
from ._recording import Call, Recorder

__all__ = ["CallRow", "LeaseRow", "call_rows", "lease_rows", "page_verdict"]

#: The word for each event; WAIT and REBUILD get their duration.
_WORDS = {
    EventKind.HIT: "fresh hit",
    EventKind.NEAR_HIT: "near hit",
    EventKind.STALE_HIT: "stale hit",
    EventKind.REPLICA_HIT: "replica hit",
    EventKind.MISS: "miss",
    EventKind.UNFILLED: "unfilled",
    EventKind.LEASE_WON: "lease won",
    EventKind.LEASE_BUSY: "lease busy",
    EventKind.LEASE_LOST: "lease lost",
    EventKind.WAIT: "waited",
    EventKind.WAIT_TIMEOUT: "gave up waiting",
    EventKind.NO_WAIT: "did not wait (on the event loop)",
    EventKind.REBUILD: "rebuilt in",
    EventKind.REBUILD_ERROR: "rebuild raised",
    EventKind.COMMIT_REJECTED: "commit rejected (lease lost)",
    EventKind.COMMIT_FAILED: "commit failed",
    EventKind.CORRUPT: "unreadable value",
    EventKind.REDIS_ERROR: "Redis error",
    EventKind.REDIS_DOWN: "Redis down",
    EventKind.REDIS_UP: "Redis back",
    EventKind.FAIL_OPEN: "fail-open",
    EventKind.WRITE_DROPPED: "write dropped",
    EventKind.NEAR_INVALIDATION: "near copy dropped",
    EventKind.NEAR_EVICTION: "near copy evicted",
    EventKind.NEAR_FLUSH: "near cache flushed",
}

#: A call's kind, for counting and colouring: the first of these its events show.
_KINDS = (
    ("fail-open", {EventKind.FAIL_OPEN, EventKind.WRITE_DROPPED, EventKind.REDIS_ERROR}),
    ("wait", {EventKind.WAIT, EventKind.WAIT_TIMEOUT}),
    ("lease", {EventKind.LEASE_WON}),
    ("miss", {EventKind.MISS, EventKind.UNFILLED, EventKind.CORRUPT}),
    ("stale", {EventKind.STALE_HIT}),
    ("hit", {EventKind.HIT, EventKind.NEAR_HIT, EventKind.REPLICA_HIT}),
)

#: What became of a lease the request held, by the method that took it from the request.
_SETTLED_BY = {
    "add": "given back by",
    "delete": "cancelled by",
    "delete_many": "cancelled by",
    "set_many": "cancelled by",
    "clear": "given back by",
    "get": "given back by",
}
_COMMITTING = {"set", "get_or_set", "get_or_set_many", "incr_version", "decr_version"}


@dataclass(frozen=True)
class CallRow:
    """A call, as the panel lists it."""

    number: int
    depth: int
    alias: str
    method: str
    key: str
    outcome: str
    kind: str  #: "hit", "stale", "miss", "lease", "wait", "fail-open", "error" or "other"
    ms: float


@dataclass(frozen=True)
class LeaseRow:
    """A lease the request held, and what became of it."""

    alias: str
    key: str
    won_by: str  #: "get #1"
    without_redis: bool  #: granted by this process alone: Redis was away
    fate: str


def as_dicts(rows: Iterable[CallRow | LeaseRow]) -> list[dict[str, Any]]:
    """``rows`` as the toolbar keeps them: JSON objects."""
    return [asdict(row) for row in rows]


# --- calls ------------------------------------------------------------------------


def call_rows(calls: Iterable[Call]) -> list[CallRow]:
    """Each call, in words."""
    return [
        CallRow(
            number=call.number,
            depth=call.depth,
            alias=call.alias,
            method=call.method,
            key=_subject(call),
            outcome=_outcome(call),
            kind=_kind(call),
            ms=round(call.duration * 1000, 2),
        )
        for call in calls
    ]


def _plain(method: str) -> str:
    """The sync name of ``method``: ``get`` for ``aget``."""
    return method if method == "add" else method.removeprefix("a")


def _subject(call: Call) -> str:
    method = _plain(call.method)
    if method in ("invalidate_tags", "delete_tags"):
        return "tags " + ", ".join(call.keys)
    if method in ("clear", "invalidate_all"):
        return "(every key)"
    return ", ".join(call.keys)


def _kind(call: Call) -> str:
    if call.error is not None:
        return "error"
    kinds = {event.kind for event in call.events}
    for kind, shown_by in _KINDS:
        if kinds & shown_by:
            return kind
    return "other"


def _outcome(call: Call) -> str:
    words = _event_words(call)
    said = _result_words(call)
    if said:
        words.append(said)
    if call.error is not None:
        words.append(f"raised {type(call.error).__name__}: {call.error}")
    return ", ".join(words)


def _event_words(call: Call) -> list[str]:
    """The words of the call's events, in order, each repeat counted once
    (``Redis error x3``); a key's name before its words when the call has
    several keys."""
    several = len(call.keys) > 1
    missed: set[str] = set()
    words: list[str] = []
    counts: dict[str, int] = {}
    for event in call.events:
        word = _word(event)
        if event.kind is EventKind.MISS:
            missed.add(event.key)
        elif event.kind is EventKind.LEASE_WON and event.key not in missed:
            word = "stale, lease won"  # no miss before it: a stale value, which this request refreshes
        if several and event.key:
            word = f"{call.given(event.key)}: {word}"
        if word in counts:
            counts[word] += 1
        else:
            counts[word] = 1
            words.append(word)
    return [word if counts[word] == 1 else f"{word} x{counts[word]}" for word in words]


def _word(event: Event) -> str:
    word = _WORDS.get(event.kind, event.kind.value.replace("_", " "))
    if event.duration is not None and event.kind in (EventKind.WAIT, EventKind.REBUILD):
        return f"{word} {event.duration * 1000:.1f} ms"
    if event.error is not None and event.kind is EventKind.REBUILD_ERROR:
        return f"{word} {type(event.error).__name__}"
    return word


#: The events that say whether a read found a value.
_FOUND_OR_NOT = {
    *(EventKind.HIT, EventKind.NEAR_HIT, EventKind.STALE_HIT, EventKind.REPLICA_HIT),
    *(EventKind.MISS, EventKind.UNFILLED, EventKind.CORRUPT, EventKind.LEASE_WON),
}


def _took_alone(call: Call) -> bool:
    """Whether ``call`` settled a lease granted without Redis (under ``FAIL_OPEN``)."""
    return any(alone and name not in call.after for name, (_, alone) in call.before.items())


def _result_words(call: Call) -> str:
    """What the call's result says, where its events do not."""
    if call.error is not None:
        return ""
    method, result = _plain(call.method), call.result
    if method in ("get", "get_or_set"):
        kinds = {event.kind for event in call.events}
        return "" if kinds & _FOUND_OR_NOT else ("found" if result is not None else "not found")
    if method == "set" and _took_alone(call):
        return "stored nowhere: Redis away (served to this process's callers)"
    if method in ("get_many", "get_or_set_many"):
        found = len(result) if isinstance(result, dict) else 0
        return f"{found} of {len(call.keys)} found" if method == "get_many" else ""
    if method in ("set", "set_many"):
        return "stored"
    if method in ("add", "touch", "delete", "has_key", "invalidate"):
        yes, no = {
            "add": ("added", "not added: the key exists"),
            "touch": ("touched", "not found"),
            "delete": ("deleted", "not found"),
            "has_key": ("present", "absent"),
            "invalidate": ("marked stale", "not found"),
        }[method]
        return yes if result else no
    if method in ("incr", "decr"):
        return f"now {result}"
    if method in ("incr_version", "decr_version"):
        return f"now version {result}"
    if method == "ttl":
        return "never goes stale" if result is None else f"fresh for {result:.1f} s"
    return {
        "delete_many": "deleted",
        "clear": "cleared",
        "invalidate_tags": "marked stale",
        "delete_tags": "deleted",
        "invalidate_all": "marked stale",
    }.get(method, "")


# --- leases -----------------------------------------------------------------------


def lease_rows(recorder: Recorder) -> list[LeaseRow]:
    """Every lease the request won, in the order won, and what became of each:
    found by comparing the request's leases before and after each call, and
    with those it holds now."""
    rows: list[dict[str, Any]] = []
    held: dict[tuple[CacheConfig, str], dict[str, Any]] = {}  # the rows of leases not yet settled

    def won(call: Call, name: str, without_redis: bool) -> dict[str, Any]:
        row = {
            "alias": call.alias,
            "key": call.given(name),
            "won_by": f"{call.method} #{call.number}",
            "without_redis": without_redis,
            "fate": "",
        }
        rows.append(row)
        return row

    for call in recorder.calls:
        for name, (state, _) in call.before.items():
            row = held.get((call.config, name))
            if row is None:
                continue  # won before the recording began
            after = call.after.get(name)
            if after is None:
                row["fate"] = _settled(call, name, state)
                del held[call.config, name]
            elif state == "held" and after[0] == "deferred":
                row["fate"] = f"{call.method} #{call.number} stores it after its page"
        for name, (_, without_redis) in call.after.items():
            if name not in call.before:
                held[call.config, name] = won(call, name, without_redis)
        for event in call.events:
            if event.kind is EventKind.LEASE_WON and event.key not in call.after:
                won(call, event.key, False)["fate"] = _within(call)  # get_or_set's, for its rebuild
    now = recorder.holdings()
    for (config, name), row in held.items():
        state = now.get(config, {}).get(name, ("", False))[0]
        if state == "held":
            row["fate"] = "held at the response: given back when the request ends (nothing stored it)"
        elif state == "deferred":
            row["fate"] = "committed when the request ends, after its page"
        elif not row["fate"]:
            row["fate"] = "settled outside the recorded calls"
    return [LeaseRow(**row) for row in rows]


def _settled(call: Call, name: str, state: str) -> str:
    """What ``call`` did with the lease on ``name`` it took from the request."""
    method = _plain(call.method)
    by = f"{call.method} #{call.number}"
    kinds = {event.kind for event in call.events if event.key in (name, "")}
    if state == "deferred":
        return f"committed by {by}, with its page"
    if method in _COMMITTING:
        if call.before[name][1]:
            return f"{by} served it to this process's callers: stored nowhere (Redis away)"
        if EventKind.COMMIT_REJECTED in kinds:
            return f"lost before {by} could commit it"
        if kinds & {EventKind.COMMIT_FAILED, EventKind.WRITE_DROPPED}:
            return f"{by} could not store it: Redis failed"
        return f"committed by {by}"
    return f"{_SETTLED_BY.get(method, 'settled by')} {by}"


def _within(call: Call) -> str:
    """What became of a lease won and settled within one call (``get_or_set``'s rebuild)."""
    kinds = {event.kind for event in call.events}
    if EventKind.REBUILD_ERROR in kinds:
        return f"given back within {call.method} #{call.number}: its function raised"
    if kinds & {EventKind.LEASE_LOST, EventKind.COMMIT_REJECTED}:
        return f"lost within {call.method} #{call.number}"
    return f"committed within {call.method} #{call.number}"


# --- the header -------------------------------------------------------------------

#: What the key of a page starts with (Django's cache middleware names them so).
_PAGE_KEY = "views.decorators.cache.cache_page."


def page_verdict(calls: Iterable[Call]) -> str | None:
    """``"HIT"``, ``"STALE"`` or ``"MISS"`` for a response of Django's cache
    middleware or ``cache_page``, from the reads they made of the page and
    its header list; ``None`` if they made none (the response is not one of
    theirs)."""
    verdict = None
    for call in calls:
        if call.method not in ("get", "aget") or call.error is not None or not call.keys:
            continue
        key = call.keys[0]
        if key.startswith(_PAGE_KEY):
            if call.result is None:
                verdict = "MISS"
            else:
                stale = any(event.kind is EventKind.STALE_HIT for event in call.events)
                verdict = "STALE" if stale else "HIT"
        elif is_header_key(key) and call.result is None:
            verdict = "MISS"  # no page is looked for without its header list
    return verdict
