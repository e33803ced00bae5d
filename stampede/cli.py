"""``python -m stampede`` (and the ``stampede`` command): look inside a cache.

::

    stampede --url redis://cache:6379/0 --namespace shop inspect user:42 cart:7
    stampede --namespace shop invalidate-tags users
    stampede stats --json

``inspect`` shows, for each key, whether its entry is fresh, stale or
missing and why (its ttl, an ``invalidate``, which tag or ``invalidate_all``),
when it was written and how long its rebuild took, its size and stored form,
its tags and what became of each since, and its lease: free, held (for how
long, by which ``host:pid``), lapsed, marked as read and never written, or
failed (the error, and when a rebuild is tried again). ``stats`` counts a
namespace's entries, bytes, leases held and tag states by ``SCAN`` (never
``KEYS``), with a progress line on a terminal. ``--json`` prints data instead.

Django's ``manage.py stampede`` and Flask's ``flask stampede`` run the same
commands on a configured cache: :func:`main` with ``instance``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any, TextIO

import redis

from ._core.inspection import (
    EntryReport,
    LeaseReport,
    TagReport,
    inspect_entry,
    inspect_lease,
    is_entry,
    recorded_tags,
)
from ._exceptions import StampedeError
from ._sync.stampede import Stampede

__all__ = ["main"]

#: Keys asked per ``SCAN`` step, and read per pipeline while counting.
SCAN_COUNT = 1000


def main(
    argv: Sequence[str] | None = None,
    *,
    instance: Stampede | None = None,
    prog: str = "stampede",
    key_of: Callable[[str], str] | None = None,
    out: TextIO | None = None,
) -> int:
    """Run the command line ``argv``; returns the exit status.

    ``instance``: the :class:`~stampede.Stampede` to look into (a framework's
    configured cache); without it, one is made from ``--url`` and
    ``--namespace``. ``key_of``: how a key given on the command line becomes
    the instance's key (Django's ``make_key``)."""
    out = out or sys.stdout
    args = _parser(prog, configured=instance is not None).parse_args(argv)
    owned = instance is None
    try:
        sf = instance if instance is not None else Stampede.from_url(args.url, namespace=args.namespace)
    except StampedeError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    try:
        return int(args.run(sf, args, out, key_of or (lambda key: key)))
    except (StampedeError, redis.exceptions.RedisError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    finally:
        if owned:
            sf.close()


def _parser(prog: str, *, configured: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Look inside a stampede cache, and invalidate its groups."
    )
    if not configured:
        parser.add_argument(
            "--url",
            default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
            help="the Redis (default: $REDIS_URL, else redis://localhost:6379/0)",
        )
        parser.add_argument("--namespace", default="stampede", help="the namespace (default: stampede)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    # --json after the command too (stampede inspect KEY --json).
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = functools.partial(commands.add_parser, parents=[shared])
    inspect = add("inspect", help="what Redis holds under keys, their tags and their leases")
    inspect.add_argument("keys", nargs="+", metavar="KEY")
    inspect.set_defaults(run=_inspect)
    for name, what in (
        ("invalidate-tags", "mark every entry carrying one of these tags stale (invalidate_tags)"),
        ("delete-tags", "make every entry carrying one of these tags missing (delete_tags)"),
    ):
        command = add(name, help=what)
        command.add_argument("tags", nargs="+", metavar="TAG")
        command.set_defaults(run=_groups)
    invalidate_all = add("invalidate-all", help="mark every entry of the namespace stale")
    invalidate_all.set_defaults(run=_groups, tags=())
    stats = add("stats", help="entries, bytes, leases held and tag states, by SCAN")
    stats.add_argument("--count", type=int, default=SCAN_COUNT, help="keys per SCAN step")
    stats.set_defaults(run=_stats)
    return parser


# --- inspect -----------------------------------------------------------------------


def _inspect(sf: Stampede, args: argparse.Namespace, out: TextIO, key_of: Callable[[str], str]) -> int:
    client = sf.client
    seconds, micros = client.time()
    now = seconds + micros / 1_000_000
    reports = []
    for key in args.keys:
        names = sf._keys(key_of(key))
        pipe = client.pipeline(transaction=False)
        pipe.get(names.value)
        pipe.get(names.lease)
        pipe.pttl(names.lease)
        raw, lease, pttl = (_bytes_or_none(reply) for reply in pipe.execute(raise_on_error=False))
        ids = recorded_tags(raw)
        state_names = [sf._settings.tags.key(tag) for tag in ids]
        states = dict(zip(ids, _get_each(client, state_names), strict=True))
        reports.append(inspect_entry(key, raw, lease, states, now, pttl if isinstance(pttl, int) else -2))
    if args.json:
        json.dump([report.as_dict() for report in reports], out, indent=2)
        out.write("\n")
    else:
        for report in reports:
            out.write(_described(report, now))
    return 0


def _bytes_or_none(reply: Any) -> Any:
    """A pipeline's reply: ``None`` for an error (another type of key: foreign)."""
    return None if isinstance(reply, Exception) else reply


def _get_each(client: Any, names: list[bytes]) -> list[bytes | None]:
    """Each of ``names`` (one GET each: on a cluster they live on other nodes)."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
    return [_bytes_or_none(reply) for reply in pipe.execute(raise_on_error=False)] if names else []


def _described(report: EntryReport, now: float) -> str:
    lines = [f"{report.key}: {report.status}" + (f" ({report.because})" if report.because else "")]
    if report.created_at is not None:
        if report.fresh_until is None:
            lines.append("  fresh until   never stale (ttl=None)")
        else:
            lines.append(
                f"  fresh until   {_when(report.fresh_until)} ({_relative(report.fresh_until - now)})"
            )
        lines.append(f"  written       {_when(report.created_at)} ({_duration(report.age or 0.0)} ago)")
        lines.append(f"  last rebuild  {_duration(report.rebuild_seconds or 0.0)}")
        form = [f"{report.bytes:,} bytes", report.format or "?"]
        form += [word for word, on in (("compressed", report.compressed), ("signed", report.signed)) if on]
        if report.marked_stale:
            form.append("marked stale")
        lines.append("  stored        " + ", ".join(form))
        tags = [_tag(report.namespace, "namespace")] if report.namespace is not None else []
        tags += [_tag(tag, repr(tag.name)) for tag in report.tags]
        lines.append("  tags          " + "; ".join(tags))
    elif report.bytes:
        lines.append(f"  stored        {report.bytes:,} bytes")
    lines.append("  lease         " + _lease(report.lease))
    return "\n".join(lines) + "\n"


def _tag(report: TagReport, name: str) -> str:
    return f"{name} {report.since}"


def _lease(lease: LeaseReport) -> str:
    by = f" by {lease.holder}" if lease.holder else ""
    if lease.state == "held":
        return (
            f"held{by}, {_duration(lease.remaining or 0.0)} more (won {_duration(lease.held_for or 0.0)} ago)"
        )
    if lease.state == "lapsed":
        return f"lapsed{by} (won {_duration(lease.held_for or 0.0)} ago; its holder may still store)"
    if lease.state == "unfilled":
        return "free; marked as read and never written (reads miss at once)"
    if lease.state == "failed":
        return (
            f"free; the last rebuild raised ({lease.failures} in a row): {lease.error}; "
            f"tried again in {_duration(lease.remaining or 0.0)}"
        )
    if lease.state == "foreign":
        return "held by data that is not stampede's" + (
            f" for {_duration(lease.remaining)}" if lease.remaining else ""
        )
    return "free"


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _relative(seconds: float) -> str:
    return f"in {_duration(seconds)}" if seconds >= 0 else f"{_duration(-seconds)} ago"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 120:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


# --- invalidate-tags, delete-tags, invalidate-all ---------------------------------------


def _groups(sf: Stampede, args: argparse.Namespace, out: TextIO, key_of: Callable[[str], str]) -> int:
    if args.command == "invalidate-tags":
        sf.invalidate_tags(*args.tags)
    elif args.command == "delete-tags":
        sf.delete_tags(*args.tags)
    else:
        sf.invalidate_all()
    done = {"command": args.command, "namespace": sf._settings.keys.namespace, "tags": list(args.tags)}
    if args.json:
        json.dump(done, out)
        out.write("\n")
    else:
        what = ", ".join(repr(tag) for tag in args.tags) or "every entry"
        out.write(f"{args.command}: {what} in namespace {done['namespace']!r}\n")
    return 0


# --- stats -------------------------------------------------------------------------


def _stats(sf: Stampede, args: argparse.Namespace, out: TextIO, key_of: Callable[[str], str]) -> int:
    client = sf.client
    keys = sf._settings.keys
    seconds, micros = client.time()
    now = seconds + micros / 1_000_000
    counts: Counter[str] = Counter()
    total = _dbsize(client)
    progress = _Progress(total) if sys.stderr.isatty() else None
    for names in _scanned(client, keys.pattern, args.count):
        pipe = client.pipeline(transaction=False)
        kinds = [_kind(name, keys.prefix) for name in names]
        for name, kind in zip(names, kinds, strict=True):
            if kind == "lease":
                pipe.get(name)
            else:
                pipe.strlen(name)
                pipe.getrange(name, 0, 0)  # an entry's first byte says it is one
        replies = iter(pipe.execute(raise_on_error=False))
        for kind in kinds:
            reply = next(replies)
            if kind == "lease":
                state = "foreign" if isinstance(reply, Exception) else inspect_lease(reply, now).state
                counts[f"leases {state}"] += 1
                continue
            first = next(replies)
            if isinstance(reply, Exception) or (kind == "entries" and not is_entry(first)):
                counts["foreign"] += 1
                continue
            counts[kind] += 1
            counts[f"{kind} bytes"] += int(reply)
        counts["scanned"] += len(names)
        if progress is not None:
            progress.show(counts["scanned"])
    if progress is not None:
        progress.done()
    found = {
        "namespace": keys.namespace,
        "entries": counts["entries"],
        "entry_bytes": counts["entries bytes"],
        "leases_held": counts["leases held"],
        "leases_other": sum(
            n for kind, n in counts.items() if kind.startswith("leases ") and kind != "leases held"
        ),
        "tag_states": counts["tag states"],
        "namespace_state": counts["namespace state"],
        "foreign": counts["foreign"],
        "scanned": counts["scanned"],
    }
    if args.json:
        json.dump(found, out)
        out.write("\n")
    else:
        parts = [
            f"{found['entries']:,} entries ({found['entry_bytes']:,} bytes)",
            f"{found['leases_held']:,} leases held",
            f"{found['leases_other']:,} other lease keys (lapsed, marks of keys read and never written, "
            "failed rebuilds)",
            f"{found['tag_states']:,} tag states",
        ]
        if found["namespace_state"]:
            parts.append("the namespace's state")
        if found["foreign"]:
            parts.append(f"{found['foreign']:,} keys of other types")
        out.write(f"namespace {found['namespace']!r}: " + ", ".join(parts) + "\n")
    return 0


def _dbsize(client: Any) -> int:
    size = client.dbsize()
    return sum(size.values()) if isinstance(size, dict) else int(size)


def _scanned(client: Any, pattern: bytes, count: int) -> Iterator[list[bytes]]:
    """The names matching ``pattern``, a ``SCAN`` step's worth at a time (every
    primary's, on a cluster)."""
    batch: list[bytes] = []
    for name in client.scan_iter(match=pattern, count=count):
        batch.append(name)
        if len(batch) >= count:
            yield batch
            batch = []
    if batch:
        yield batch


def _kind(name: bytes, prefix: bytes) -> str:
    """What a key of the namespace whose names start with ``prefix`` is. A
    user's key never holds a ``}`` (keys escape it), so a name with one after
    the prefix is stampede's own bookkeeping."""
    if b"}" not in name[len(prefix) :]:
        return "entries"
    if name.endswith(b"}:lease"):
        return "lease"
    if name == prefix + b"}:tag":
        return "namespace state"
    if name.endswith(b"}:tag"):
        return "tag states"
    return "scratch"


class _Progress:
    """``scanned N of about M keys``, rewritten in place on a terminal."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.shown_at = 0.0

    def show(self, scanned: int) -> None:
        now = time.monotonic()
        if now - self.shown_at >= 0.2:
            self.shown_at = now
            share = f" ({min(scanned / self.total, 1):.0%})" if self.total else ""
            sys.stderr.write(f"\rscanned {scanned:,} of about {self.total:,} keys{share}")
            sys.stderr.flush()

    def done(self) -> None:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
