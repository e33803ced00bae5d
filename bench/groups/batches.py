"""Part 2 of ``python -m bench grouppeers``: batches. P processes, lined up on a barrier, ask at
once for the same cold batch of keys, round after round: stampede's ``get_or_rebuild_many``
beside dogpile.cache's ``get_or_create_multi`` (``distributed_lock=True``); then what a warm batch
costs in this process, beside a plain ``MGET`` and unpickling as the floor. See
:mod:`.grouppeers`.
"""

from __future__ import annotations

import math
import statistics
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

import redis
import redis.asyncio

from .._common.report import Section, Table, millis
from .._common.workload import make_value
from ..peers.base import Batch, BatchRebuild
from ..peers.dogpile import DogpileBatch
from ..peers.naive import PlainBatch
from ..peers.stampede import StampedeBatch
from ._monitor import Cost, monitored
from ._processes import REPORT_TIMEOUT, START_TIMEOUT, Message, expect, finish
from ._workload import (
    BATCH,
    COUNTER,
    REBUILD,
    SOCKET_TIMEOUT,
    STALE_TTL,
    TAG,
    TAG_CHECK,
    TTL,
    Scale,
    stampede_options,
)

__all__ = ["BATCH_LABELS", "ColdResult", "batch_sections", "run_cold_batch", "warm_batch_cost"]


def open_batch(library: str, url: str) -> Batch:
    """The batch read of ``library`` (a key of :data:`BATCH_LABELS`)."""
    if library in ("stampede", "stampede-tagged"):
        return StampedeBatch(url, stampede_options((TAG,) if library == "stampede-tagged" else ()))
    if library == "dogpile":
        return DogpileBatch(url, ttl=TTL, stale_ttl=STALE_TTL)
    if library == "plain":
        return PlainBatch(url, ttl=TTL)
    raise KeyError(library)


BATCH_LABELS = {
    "stampede": "stampede `get_or_rebuild_many`",
    "stampede-tagged": "stampede `get_or_rebuild_many`, `tags=('group',)`",
    "dogpile": "dogpile.cache `get_or_create_multi`, `distributed_lock=True`",
    "plain": "plain `MGET` + unpickle (no protection: the floor)",
}


def batch_keys(library: str, round_: int) -> list[str]:
    return [f"{library}:r{round_}:k{i}" for i in range(BATCH)]


def round_counter(library: str, round_: int) -> str:
    """Where one round's rebuilds are counted: a key per round, as the workers may start the next
    round before this process has read the last one's count."""
    return f"{COUNTER}:{library}:r{round_}"


def batch_rebuilder(client: redis.Redis, counter: str, asked_for: list[int]) -> BatchRebuild:
    """The batch's slow query: counted in Redis under ``counter``, one sleep for the batch;
    ``asked_for`` gets the size of each batch it is asked for."""

    def rebuild_many(keys: list[str]) -> dict[str, Any]:
        client.incrby(counter, len(keys))
        asked_for.append(len(keys))
        time.sleep(REBUILD)
        return {key: {"key": key, **make_value()} for key in keys}

    return rebuild_many


def batch_caller(
    library: str, url: str, rounds: int, index: int, barrier: Barrier, out: Queue[Message]
) -> None:
    """Worker process: each round, ask for the round's cold batch at the same moment as the others."""
    try:
        batch = open_batch(library, url)
        client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
        try:
            client.ping()
            # Connect and load what the library loads on first use (counted apart).
            batch.get_many([f"{library}:connect"], batch_rebuilder(client, f"{COUNTER}:connect", []))
            for round_ in range(rounds):
                keys = batch_keys(library, round_)
                asked_for: list[int] = []
                rebuild_many = batch_rebuilder(client, round_counter(library, round_), asked_for)
                barrier.wait(START_TIMEOUT)
                began = time.perf_counter()
                values = batch.get_many(keys, rebuild_many)
                took = time.perf_counter() - began
                wrong = sum(1 for key in keys if values.get(key, {}).get("key") != key)
                out.put(("round", index, (round_, took, sum(asked_for), wrong)))
        finally:
            batch.close()
            client.close()
    except BaseException:
        out.put(("error", index, traceback.format_exc()))
        raise


@dataclass(frozen=True)
class ColdResult:
    library: str
    per_key: list[float]  # rebuilds per key, by round
    rebuilders: list[int]  # callers that rebuilt anything, by round
    slowest: list[float]  # the slowest caller's seconds, by round
    wrong: int


def run_cold_batch(library: str, url: str, scale: Scale, context: SpawnContext) -> ColdResult:
    admin = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    admin.flushall()
    out: Queue[Message] = context.Queue()
    barrier = context.Barrier(scale.batch_processes)
    processes = [
        context.Process(target=batch_caller, args=(library, url, scale.rounds, i, barrier, out), daemon=True)
        for i in range(scale.batch_processes)
    ]
    per_key: list[float] = []
    rebuilders: list[int] = []
    slowest: list[float] = []
    wrong = 0
    try:
        for process in processes:
            process.start()
        for round_ in range(scale.rounds):
            done = expect(out, processes, "round", len(processes), START_TIMEOUT + REPORT_TIMEOUT)
            if any(reported[0] != round_ for reported in done):
                raise RuntimeError("the workers' rounds got out of step")
            per_key.append(int(admin.get(round_counter(library, round_)) or 0) / BATCH)
            rebuilders.append(sum(1 for _, _, rebuilt, _ in done if rebuilt))
            slowest.append(max(took for _, took, _, _ in done))
            wrong += sum(bad for _, _, _, bad in done)
    finally:
        barrier.abort()
        finish(processes)
        admin.close()
    return ColdResult(library, per_key, rebuilders, slowest, wrong)


def warm_batch_cost(library: str, url: str, scale: Scale) -> Cost:
    batch = open_batch(library, url)
    client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    keys = [f"warm:{library}:k{i}" for i in range(BATCH)]
    rebuild_many = batch_rebuilder(client, COUNTER, [])
    try:
        for _ in range(20):  # stored, then read warm: connections open, tag states read
            batch.get_many(keys, rebuild_many)
        with monitored(url) as tally:
            for _ in range(scale.batch_calls):
                batch.get_many(keys, rebuild_many)
        best = math.inf
        for _ in range(3):
            began = time.process_time()
            for _ in range(scale.batch_calls):
                batch.get_many(keys, rebuild_many)
            best = min(best, (time.process_time() - began) / scale.batch_calls)
    finally:
        batch.close()
        client.close()
    calls = scale.batch_calls
    return Cost(
        BATCH_LABELS[library],
        sum(tally.sent.values()) / calls,
        sum(tally.scripted.values()) / calls,
        tally.names(),
        best,
    )


def batch_sections(cold: Sequence[ColdResult], warm: Sequence[Cost], scale: Scale) -> list[Section]:
    rounds = scale.rounds
    cold_section = Section(
        title=f"2a. {scale.batch_processes} processes ask at once for the same {BATCH} cold keys",
        intro=(
            f"Lined up on a barrier; {rounds} round{'s' if rounds > 1 else ''}, new keys each round. The "
            f"batch rebuild takes {millis(REBUILD)} whatever its size. Rebuilds per key: counted in Redis "
            "(ideal 1.00); callers that rebuilt: how many of the processes' batch rebuilds ran with any key; "
            "slowest caller: until the last process had its batch (median of rounds)."
        ),
        table=Table(
            headers=[
                "library",
                "rebuilds per key (mean / worst)",
                "callers that rebuilt",
                "slowest caller",
                "wrong values",
            ],
            rows=[
                [
                    BATCH_LABELS[result.library],
                    f"{statistics.fmean(result.per_key):.2f} / {max(result.per_key):.2f}",
                    f"{statistics.fmean(result.rebuilders):.1f} of {scale.batch_processes}",
                    millis(statistics.median(result.slowest)),
                    str(result.wrong),
                ]
                for result in cold
            ],
            align="lrrrr",
        ),
        notes=(
            "dogpile's `get_or_create_multi` reads the batch once (`MGET`), then takes each missing key's "
            "lock in turn (sorted), blocking while another holds it (polling every `lock_sleep`, 0.1 s); "
            "it does not read a key again once it holds its lock, so a caller that waited for another's "
            "regeneration regenerates the key again.",
            "stampede's `get_or_rebuild_many` takes the leases it can in one script and calls "
            "`rebuild_many` with those keys only; it waits for the keys others hold, woken when they land.",
        ),
    )
    warm_section = Section(
        title=f"2b. A warm batch of {BATCH} keys, one process",
        intro=(
            f"Commands per call: `MONITOR` over {scale.batch_calls} calls (stampede also reads the "
            f"states of the namespace and tags it has not read in `tag_check_interval`, {TAG_CHECK:g} s). "
            f"CPU per call: this process's CPU time, best of 3 blocks of {scale.batch_calls} calls."
        ),
        table=Table(
            headers=[
                "library",
                "commands sent per call",
                "which (in all)",
                "run inside scripts per call",
                "CPU per call",
            ],
            rows=[
                [
                    cost.label,
                    f"{cost.sent:.2f}",
                    cost.names,
                    f"{cost.scripted:.2f}",
                    f"{cost.cpu * 1e6:.0f} µs",
                ]
                for cost in warm
            ],
            align="lrlrr",
        ),
    )
    return [cold_section, warm_section]
