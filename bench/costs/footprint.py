"""Footprint: the Redis memory one cache entry takes, through each store and for each kind of value.

``python -m bench footprint [--entries 5000] [--rounds 3] [--redis-server PATH]`` starts its own
redis-server. For each store and each kind of value: ``FLUSHALL``, read ``used_memory`` (``INFO
memory``; less ``mem_clients_normal``, the connections' buffers), write ``--entries`` entries (keys
``user:0`` .. ``user:N-1``, a TTL of 300 s) through the store's public ``set`` with its default
settings, read ``used_memory`` again; bytes per entry are the difference over N, the median of
``--rounds`` rounds. The figures include everything an entry costs Redis: the key (with the store's
prefix), the value, the expiry, the hash tables' share. They depend on the allocator's size classes
(jemalloc rounds up differently from libc malloc), so the heading names the server's version and
allocator; compare within a run.

The stores: Django's own ``RedisCache`` (the reference), django-redis, ``django_stampede``'s
``StampedeCache`` signed (the default, keyed from ``SECRET_KEY``) and unsigned, Flask-Caching's
``RedisCache``, and stampede's core unsigned and signed beside a plain ``SET`` of
``pickle.dumps(value)`` under the same key. A store whose package is missing is left out with a note.
"""

from __future__ import annotations

import argparse
import datetime
import pickle
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

import stampede
from stampede.testing import RedisServer, find_redis_server

from .._common.installed import importable
from .._common.report import Table, render_table
from ..peers.django import configure as configure_django

__all__ = ["main"]

TTL = 300
SIGNING_KEY = "k" * 32
#: How long Redis is left idle before ``used_memory`` is read: three runs of its serverCron.
SETTLE_SECONDS = 0.3


# --- the values ------------------------------------------------------------------


def _page(i: int, size: int) -> str:
    """An HTML page of exactly ``size`` characters, distinct per ``i``: a list of orders, as a
    rendered template would be (markup repeated with varying figures: compressible)."""
    head = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Orders of user {i}</title>"
        '<link rel="stylesheet" href="/static/site.css"></head><body>'
        f'<header><nav><a href="/">Home</a> <a href="/users/{i}/">Profile</a> '
        '<a href="/orders/">Orders</a></nav></header>'
        f'<main><h1>Orders of user {i}</h1><ul class="orders">\n'
    )
    tail = "</ul></main><footer><p>&copy; 2026 Example Shop</p></footer></body></html>\n"
    parts = [head]
    length = len(head) + len(tail)
    for j in range(size):
        order = i * 1000 + j
        item = (
            f'  <li class="order"><a href="/orders/{order}/">Order #{order}</a> '
            f'<span class="date">2026-{1 + j % 12:02d}-{1 + (i + j) % 28:02d}</span> '
            f'<span class="total">{(i * 37 + j * 101) % 100_000 / 100:.2f} EUR</span></li>\n'
        )
        if length + len(item) > size:
            break
        parts.append(item)
        length += len(item)
    # Whitespace up to the exact size, as templates leave: every page of a kind is the same length.
    parts.append(" " * (size - length))
    parts.append(tail)
    return "".join(parts)


_TEXT = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore. "
)

#: Each kind of value: its name, and the value of entry ``i``.
KINDS: tuple[tuple[str, Callable[[int], Any]], ...] = (
    # Above 10000, Redis's shared integers: each a value object of its own.
    ("int", lambda i: 123456 + i),
    ("small int", lambda i: i % 1000),
    ("str100", lambda i: (f"user {i}: {_TEXT}")[:100]),
    ("small dict", lambda i: {"id": i, "name": f"user{i}", "active": True}),
    ("page 2 KB", lambda i: _page(i, 2_000)),
    ("page 20 KB", lambda i: _page(i, 20_000)),
)


# --- the stores --------------------------------------------------------------------


@dataclass(frozen=True)
class Store:
    """A column of the table: ``write(key, value)`` stores one entry with a TTL of :data:`TTL`."""

    name: str
    write: Callable[[str, Any], None]


def _django_stores(url: str, notes: list[str]) -> list[Store]:
    """The Django backends, configured once (several aliases on the one server)."""
    if not importable("django"):
        notes.append("Django is not installed: its stores are left out.")
        return []
    from django.core.cache import caches

    aliases: dict[str, dict[str, Any]] = {
        "Django stock": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url},
        "django-redis": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url},
        "Django stampede signed": {"BACKEND": "django_stampede.StampedeCache", "LOCATION": url},
        "Django stampede unsigned": {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": url,
            "OPTIONS": {"SIGNING_KEY": None},
        },
    }
    if not importable("django_redis"):
        notes.append("django-redis is not installed: its column is left out.")
        del aliases["django-redis"]
    configure_django(
        {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}, **aliases},
        secret_key="footprint-" + "s" * 40,
    )
    return [Store(alias, _django_writer(caches[alias])) for alias in aliases]


def _django_writer(cache: Any) -> Callable[[str, Any], None]:
    def write(key: str, value: Any) -> None:
        cache.set(key, value, timeout=TTL)

    return write


def _flask_store(url: str, notes: list[str]) -> list[Store]:
    if not importable("flask_caching"):
        notes.append("Flask-Caching is not installed: its column is left out.")
        return []
    from flask import Flask
    from flask_caching import Cache

    app = Flask("footprint")
    # Through the extension, as an application configures it: its default key prefix comes along.
    cache = Cache(app, config={"CACHE_TYPE": "RedisCache", "CACHE_REDIS_URL": url})

    def write(key: str, value: Any) -> None:
        with app.app_context():
            cache.set(key, value, timeout=TTL)

    return [Store("Flask-Caching", write)]


def _core_stores(client: redis.Redis) -> list[Store]:
    unsigned = stampede.Stampede(client)
    signed = stampede.Stampede(client, signing_key=SIGNING_KEY)

    def plain(key: str, value: Any) -> None:
        client.set(key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=TTL)

    return [
        Store("plain SET", plain),
        Store("core unsigned", lambda key, value: unsigned.set(key, value, ttl=TTL)),
        Store("core signed", lambda key, value: signed.set(key, value, ttl=TTL)),
    ]


#: The ratio columns: their heading, numerator and denominator.
RATIOS = (
    ("stampede signed / stock", "Django stampede signed", "Django stock"),
    ("stampede unsigned / stock", "Django stampede unsigned", "Django stock"),
    ("django-redis / stock", "django-redis", "Django stock"),
    ("core unsigned / plain SET", "core unsigned", "plain SET"),
    ("core signed / plain SET", "core signed", "plain SET"),
)


# --- measuring ---------------------------------------------------------------------


def _used_memory(admin: redis.Redis) -> int:
    """``used_memory`` less the connections' buffers, once Redis has settled.

    Redis grows a connection's query buffer to the largest command it got and frees it when the
    connection idles, in serverCron (10 times a second), which also finishes growing the keyspace's
    hash tables and samples ``mem_clients_normal``: so wait for a few of its runs, then leave the
    clients out (another store's idle connection freeing its 20 KB buffer mid-measurement made a
    cell of a 500-entry run negative)."""
    time.sleep(SETTLE_SECONDS)
    memory = admin.info("memory")
    return int(memory["used_memory"]) - int(memory.get("mem_clients_normal", 0))


def bytes_per_entry(admin: redis.Redis, store: Store, make: Callable[[int], Any], entries: int) -> float:
    """Redis's memory grown by writing ``entries`` values through ``store``, per entry."""
    admin.flushall()
    before = _used_memory(admin)
    for i in range(entries):
        store.write(f"user:{i}", make(i))
    return (_used_memory(admin) - before) / entries


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench footprint",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--entries", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--redis-server", metavar="PATH", help="the redis-server binary (default: as the tests)"
    )
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "bench", "footprint", *(sys.argv[1:] if argv is None else argv)])
    notes: list[str] = []
    with RedisServer(binary=args.redis_server or find_redis_server()) as server:
        admin = redis.Redis.from_url(server.url)
        info = admin.info("server")
        memory = admin.info("memory")
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        stores = [*_django_stores(server.url, notes), *_flask_store(server.url, notes), *_core_stores(client)]
        for store in stores:
            # Connections, pools and the scripts a store loads stay across FLUSHALL: made before the
            # first measurement, so that no round counts them.
            for _, make in KINDS:
                store.write("warm", make(0))
        # The first measurement on a fresh server comes out high (by tens of KB: something Redis
        # allocates once): made, and dropped.
        bytes_per_entry(admin, stores[0], KINDS[0][1], args.entries)
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for kind, make in KINDS:
                for store in stores:
                    measured = bytes_per_entry(admin, store, make, args.entries)
                    samples.setdefault((kind, store.name), []).append(measured)
        admin.flushall()
    medians = {cell: statistics.median(sample) for cell, sample in samples.items()}
    names = [store.name for store in stores]
    ratios = [(title, top, bottom) for title, top, bottom in RATIOS if top in names and bottom in names]
    rows = []
    for kind, _ in KINDS:
        row = [kind, *(f"{medians[kind, name]:,.0f}" for name in names)]
        row += [f"{medians[kind, top] / medians[kind, bottom]:.2f}x" for _, top, bottom in ratios]
        rows.append(row)
    table = Table(
        headers=["value", *names, *(title for title, _, _ in ratios)],
        rows=rows,
        align="l" + "r" * (len(names) + len(ratios)),
    )
    print(
        f"## Redis bytes per entry: redis-server {info['redis_version']}, "
        f"allocator {memory['mem_allocator']}\n"
    )
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"`{command}`, {now} · Python {platform.python_version()}\n")
    print(
        f"`used_memory` less `mem_clients_normal`, grown per entry: {args.entries} entries (keys "
        f"`user:0` ..), TTL {TTL} s, median of {args.rounds} round{'' if args.rounds == 1 else 's'}; "
        "each store's `set` with its default settings.\n"
    )
    print(render_table(table))
    if notes:
        print()
        print("\n".join(f"- {note}" for note in notes))
