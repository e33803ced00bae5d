"""Part 3 of ``python -m bench grouppeers``: a warm tagged hit. CPU microseconds and commands per
hit, in this process, for ``stampede.asyncio``'s ``get_or_rebuild`` (untagged and tagged) and
cashews' ``@cache(tags=...)`` (without and with ``lock=True``). See :mod:`.grouppeers`.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence

import redis
import redis.asyncio

from .._common.report import Section, Table
from ..peers.base import Tagged
from ._monitor import Cost, monitored
from ._readers import open_tagged, tag_case
from ._workload import SOCKET_TIMEOUT, Scale, rebuild_value

__all__ = ["HIT_CASES", "hit_cost", "hit_section"]

#: Each row: its label, and how to open its library on a server's URL.
HIT_CASES: tuple[tuple[str, Callable[[str], Tagged]], ...] = (
    (
        "stampede.asyncio `get_or_rebuild`, untagged",
        lambda url: open_tagged(tag_case("stampede-soft"), url, connections=4, tags=()),
    ),
    (
        "stampede.asyncio `get_or_rebuild`, `tags=('group',)`",
        lambda url: open_tagged(tag_case("stampede-soft"), url, connections=4),
    ),
    ("cashews `@cache(tags=['group'])`", lambda url: open_tagged(tag_case("cashews"), url, connections=4)),
    (
        "cashews `@cache(tags=['group'], lock=True)`",
        lambda url: open_tagged(tag_case("cashews-lock"), url, connections=4),
    ),
)


async def hit_cost(label: str, make: Callable[[str], Tagged], url: str, calls: int) -> Cost:
    tagged = make(url)  # on the running loop
    counter = redis.asyncio.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    rebuild = functools.partial(rebuild_value, counter, "hit", 0.0)
    try:
        for _ in range(200):
            await tagged.read("hit", rebuild)
        measured = min(calls, 500)
        with monitored(url) as tally:
            for _ in range(measured):
                await tagged.read("hit", rebuild)
        best = math.inf
        for _ in range(3):
            began = time.process_time()
            for _ in range(calls):
                await tagged.read("hit", rebuild)
            best = min(best, (time.process_time() - began) / calls)
    finally:
        await tagged.aclose()
        await counter.aclose()
    return Cost(
        label,
        sum(tally.sent.values()) / measured,
        sum(tally.scripted.values()) / measured,
        tally.names(),
        best,
    )


def hit_section(costs: Sequence[Cost], scale: Scale) -> Section:
    return Section(
        title="3. A warm tagged hit, asyncio, one process",
        intro=(
            "One cached value (a dict of ten fields), read again and again by one task. Commands: "
            f"`MONITOR` over up to 500 calls; CPU: best of 3 blocks of {scale.hit_calls} calls."
        ),
        table=Table(
            headers=[
                "library",
                "commands sent per hit",
                "which (in all)",
                "run inside scripts per hit",
                "CPU per hit",
            ],
            rows=[
                [
                    cost.label,
                    f"{cost.sent:.2f}",
                    cost.names,
                    f"{cost.scripted:.2f}",
                    f"{cost.cpu * 1e6:.1f} µs",
                ]
                for cost in costs
            ],
            align="lrlrr",
        ),
    )
