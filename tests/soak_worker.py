"""One worker process of the fault soak (tests/test_faults.py).

``python -m tests.soak_worker MODE CACHE_URL DB_URL OUT_DIR``: callers of a
few keys, in a loop, through the proxy in front of the cache's Redis.
MODE is ``sync`` (threads, ``get_or_rebuild``), ``asyncio`` (tasks,
``get_or_rebuild``) or ``split`` (threads, ``read`` then ``commit``, as
Django's and Flask-Caching's get-then-set does).

A rebuild reads the key's version from the "database" (a second Redis the
soak never harms) and records itself there, so the test can see how many
rebuilds of a key ran at once. Each caller checks that it is never served
a version older than one it already had; what it sees goes, one JSON line
at a time, to ``OUT_DIR/<mode>-<pid>.jsonl`` (a killed worker loses none).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

import stampede
import stampede.asyncio

KEYS = ("k0", "k1", "k2")
CALLERS = 8
REBUILD_SECONDS = 0.05
#: How long a rebuild counts as running unless it says it finished: past it,
#: its process was killed (or paused longer than the soak ever pauses one).
RUNNING_FOR = 2.0
OPTIONS: dict[str, Any] = {"ttl": 0.3, "stale_ttl": 1.0, "lease_ttl": 1.0, "wait_timeout": 2.0}
SOCKET = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}

# Registers a rebuild as running and keeps the most ever seen at once. Per
# version of the data: a delete cancels the rebuild in flight (which runs on
# regardless) and the next rebuild reads newer data, so the two are no
# duplicate work. KEYS: running (zset token -> until), most. ARGV: token,
# now, until.
RUNNING = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""


class Log:
    """Appends JSON lines, one write each (whole lines survive a SIGKILL)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, **record: Any) -> None:
        line = (json.dumps({"at": time.time(), **record}) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)


class Seen:
    """One caller's newest version per key: what it must never go below."""

    def __init__(self, log: Log, caller: str) -> None:
        self._log = log
        self._caller = caller
        self._newest: dict[str, int] = {}

    def check(self, key: str, value: Any, started: float) -> None:
        took = time.monotonic() - started
        if not (isinstance(value, list | tuple) and len(value) == 2 and isinstance(value[0], int)):
            self._log.write(kind="violation", what="foreign value", key=key, value=repr(value))
            return
        version = value[0]
        newest = self._newest.get(key, -1)
        if version < newest:
            self._log.write(
                kind="violation",
                what="older than already had",
                key=key,
                got=version,
                had=newest,
                caller=self._caller,
            )
        self._newest[key] = max(newest, version)
        self._log.write(kind="call", key=key, version=version, took=round(took, 4), caller=self._caller)

    def failed(self, key: str, exc: BaseException, started: float) -> None:
        took = time.monotonic() - started
        self._log.write(kind="error", key=key, error=type(exc).__name__, took=round(took, 4))


_TOLD = {
    "wait_timeout",
    "lease_lost",
    "commit_rejected",
    "commit_failed",
    "no_wait",
    "fail_open",
    "lease_won",
}


def events(log: Log) -> Any:
    def told(event: Any) -> None:
        if event.kind.value in _TOLD:
            log.write(kind="event", event=event.kind.value, key=event.key, thread=threading.get_ident())

    return told


def _running_args(key: str, version: int) -> tuple[list[str], list[Any], str]:
    token = uuid.uuid4().hex
    now = time.time()
    return [f"running:{key}:{version}", f"most:{key}"], [token, now, now + RUNNING_FOR], token


def run_threads(mode: str, cache_url: str, db_url: str, log: Log) -> None:
    client = redis.Redis.from_url(cache_url, **SOCKET)
    db = redis.Redis.from_url(db_url, socket_timeout=10)
    running = db.register_script(RUNNING)
    sf = stampede.Stampede(client, namespace="soak", on_event=events(log), **OPTIONS)

    def rebuild(key: str, how: str = "get_or_rebuild") -> tuple[int, int]:
        version = int(db.get(f"version:{key}") or 0)
        if how == "unleased":
            # read() said: rebuild, nothing to commit (after wait_timeout or
            # fail-open). Not one of the coordinated rebuilds the bound is on.
            time.sleep(REBUILD_SECONDS)
            return version, os.getpid()
        names, args, token = _running_args(key, version)
        at_once = running(keys=names, args=args)
        if at_once > 1:
            log.write(kind="rebuilds at once", key=key, at_once=at_once, how=how, mode=mode)
        time.sleep(REBUILD_SECONDS)
        db.zrem(names[0], token)
        return version, os.getpid()

    def caller(n: int) -> None:
        seen = Seen(log, f"{os.getpid()}-{n}")
        rng = random.Random(n)
        while True:
            key = rng.choice(KEYS)
            started = time.monotonic()
            try:
                if mode == "sync":
                    value = sf.get_or_rebuild(key, functools.partial(rebuild, key))
                else:
                    read = sf.read(key)
                    if read.found:
                        value = read.value
                    else:
                        if read.lease is None:
                            took = round(time.monotonic() - started, 4)
                            log.write(kind="unleased rebuild", key=key, took=took, caller=n)
                        value = rebuild(key, "leased" if read.lease is not None else "unleased")
                        if read.lease is None or not sf.commit(read.lease, value, store_if_lapsed=True):
                            # The caller's own render, which the cache did not
                            # store (a newer write won): not served by the cache.
                            continue
            except stampede.StampedeError as exc:
                seen.failed(key, exc, started)
                time.sleep(0.05)
                continue
            seen.check(key, value, started)
            time.sleep(rng.uniform(0, 0.02))

    threads = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(CALLERS)]
    for thread in threads:
        thread.start()
    log.write(kind="ready")
    for thread in threads:
        thread.join()


async def run_tasks(cache_url: str, db_url: str, log: Log) -> None:
    client = redis.asyncio.Redis.from_url(cache_url, **SOCKET)
    db = redis.asyncio.Redis.from_url(db_url, socket_timeout=10)
    running = db.register_script(RUNNING)
    sf = stampede.asyncio.Stampede(client, namespace="soak", on_event=events(log), **OPTIONS)

    async def rebuild(key: str) -> tuple[int, int]:
        version = int(await db.get(f"version:{key}") or 0)
        names, args, token = _running_args(key, version)
        at_once = await running(keys=names, args=args)
        if at_once > 1:
            log.write(kind="rebuilds at once", key=key, at_once=at_once, how="get_or_rebuild", mode="asyncio")
        await asyncio.sleep(REBUILD_SECONDS)
        await db.zrem(names[0], token)
        return version, os.getpid()

    async def caller(n: int) -> None:
        seen = Seen(log, f"{os.getpid()}-{n}")
        rng = random.Random(n)
        while True:
            key = rng.choice(KEYS)
            started = time.monotonic()
            try:
                value = await sf.get_or_rebuild(key, functools.partial(rebuild, key))
            except stampede.StampedeError as exc:
                seen.failed(key, exc, started)
                await asyncio.sleep(0.05)
                continue
            seen.check(key, value, started)
            await asyncio.sleep(rng.uniform(0, 0.02))

    tasks = [asyncio.create_task(caller(n)) for n in range(CALLERS)]
    log.write(kind="ready")
    await asyncio.gather(*tasks)


def main(argv: list[str]) -> None:
    mode, cache_url, db_url, out_dir = argv
    log = Log(Path(out_dir) / f"{mode}-{os.getpid()}.jsonl")
    if mode == "asyncio":
        asyncio.run(run_tasks(cache_url, db_url, log))
    else:
        run_threads(mode, cache_url, db_url, log)


if __name__ == "__main__":
    main(sys.argv[1:])
