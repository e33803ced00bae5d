"""The outage benchmark's faults and phases: Redis up, then away (killed, or frozen as behind a
firewall that drops packets), slow (every reply held back) or full (out of memory, refusing
writes), then back; when each phase began;
and what the callers' samples say of each phase.

Everything is timed by the wall clock (``time.time()``) where a moment is compared across
processes (a render in the app server began in which phase?), and by ``time.perf_counter()``
where a duration is measured.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import redis

from stampede.testing import RedisServer
from support.proxies import LagProxy

from .._common.stats import percentile

__all__ = [
    "DOING",
    "FAULTS",
    "PHASES",
    "Boundaries",
    "Fault",
    "Phase",
    "Plan",
    "Sample",
    "Tally",
    "inflict",
    "reach",
    "tally",
]

Fault = Literal["kill", "blackhole", "slow", "full"]
FAULTS: tuple[Fault, ...] = ("kill", "blackhole", "slow", "full")
Phase = Literal["up", "fault", "back"]
PHASES: tuple[Phase, ...] = ("up", "fault", "back")

#: What each fault does to the server, in a line.
DOING: dict[Fault, str] = {
    "kill": "redis-server killed (connections refused), then started again empty on its port",
    "blackhole": "redis-server frozen by SIGSTOP (connections made, nothing answered), then SIGCONT",
    "slow": "every reply of redis-server held back 300 ms by a proxy on the way (requests go at once)",
    "full": (
        "redis-server emptied (`FLUSHALL`: every key gone, as if expired) and made full "
        "(`maxmemory` 1 byte under `noeviction`: every write refused with `OOM`, reads served), "
        "then given its memory back"
    ),
}
#: Seconds the ``slow`` fault holds each reply back.
SLOW_LAG = 0.3


@dataclass(frozen=True)
class Plan:
    """How long each phase lasts, in seconds."""

    up: float
    fault: float
    back: float

    def halved(self) -> Plan:
        return Plan(self.up / 2, self.fault / 2, self.back / 2)


@dataclass(frozen=True)
class Boundaries:
    """When each phase began, and the last ended (wall clock)."""

    up: float
    fault: float
    back: float
    end: float

    def phase_of(self, at: float) -> Phase | None:
        """The phase during which the moment ``at`` fell (``None``: before or after them all)."""
        if self.up <= at < self.fault:
            return "up"
        if self.fault <= at < self.back:
            return "fault"
        if self.back <= at < self.end:
            return "back"
        return None

    def phase_met(self, start: float, end: float) -> Phase | None:
        """The phase a request (or call) from ``start`` to ``end`` is counted in: ``"fault"`` if Redis
        went away before it ended and came back after it began (it met the fault, however
        briefly), else the phase it began in (``None``: the warm-up, or after the last)."""
        if start < self.up or start >= self.end:
            return None
        if start < self.back and end >= self.fault:
            return "fault"
        return "up" if start < self.fault else "back"

    def seconds(self, phase: Phase) -> float:
        """How long ``phase`` lasted."""
        if phase == "up":
            return self.fault - self.up
        if phase == "fault":
            return self.back - self.fault
        return self.end - self.back


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


@contextlib.contextmanager
def reach(server: RedisServer, fault: Fault) -> Iterator[tuple[str, LagProxy | None]]:
    """The URL the callers of a run under ``fault`` are given: ``server``'s own, or for ``slow`` a
    proxy's in front of it (faithful until :func:`inflict` slows it), with the proxy."""
    if fault != "slow":
        yield server.url, None
        return
    with LagProxy(server.port) as proxy:
        yield proxy.url, proxy


def inflict(
    server: RedisServer, fault: Fault, plan: Plan, log: Callable[[str], None], proxy: LagProxy | None = None
) -> Boundaries:
    """Leave ``server`` up for ``plan.up`` seconds, take it away (or slow ``proxy``) by ``fault``
    for ``plan.fault``, bring it back and wait ``plan.back`` more; when each phase began. The
    fault's phase ends once the server answers again (a killed one answers ``PING``)."""
    up = time.time()
    _sleep_until(up + plan.up)
    away = time.time()
    if fault == "slow":
        if proxy is None:
            raise ValueError("the slow fault needs the proxy of reach()")
        proxy.lag = SLOW_LAG
    elif fault == "full":
        _fill(server, maxmemory=1)
    else:
        server.stop() if fault == "kill" else server.pause()
    log(f"  {fault}: Redis {fault if fault in ('slow', 'full') else 'away'} for {plan.fault:g} s")
    _sleep_until(away + plan.fault)
    if proxy is not None:
        proxy.lag = 0.0
    elif fault == "full":
        _fill(server, maxmemory=0)
    elif fault == "kill":
        server.start()
    else:
        server.resume()
    back = time.time()
    log(f"  {fault}: Redis back")
    _sleep_until(back + plan.back)
    return Boundaries(up, away, back, time.time())


def _fill(server: RedisServer, *, maxmemory: int) -> None:
    """Make ``server`` full (``maxmemory`` 1: every write refused, after emptying it) or give it
    its memory back (``0``: no limit)."""
    with redis.Redis.from_url(server.url) as client:
        if maxmemory:
            client.flushall()
            client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", maxmemory)


@dataclass(frozen=True)
class Sample:
    """One request or call: when it began (wall clock), how long it took, and what came of it: an
    HTTP status (``"200"``, ``"500"``), ``"ok"``, or the name of the exception it met."""

    start: float
    seconds: float
    outcome: str

    @property
    def end(self) -> float:
        return self.start + self.seconds

    @property
    def answered(self) -> bool:
        """Whether it got an answer: an HTTP status or a value, not an exception."""
        return self.outcome.isdigit() or self.outcome == "ok"


@dataclass(frozen=True)
class Tally:
    """What the samples that began in one phase came to; ``renders``: the renders (or rebuilds)
    that began in it, and ``seconds`` how long it lasted."""

    samples: Sequence[Sample]
    renders: int
    seconds: float

    @property
    def count(self) -> int:
        return len(self.samples)

    @property
    def failed(self) -> int:
        """Answers other than 200 (or, of a call, exceptions)."""
        return sum(1 for sample in self.samples if sample.answered and sample.outcome not in ("200", "ok"))

    @property
    def unanswered(self) -> int:
        """Requests that got no answer: the connection failed, or the client's timeout passed."""
        return sum(1 for sample in self.samples if not sample.answered)

    def outcomes(self) -> dict[str, int]:
        """How many samples came to each outcome."""
        found: dict[str, int] = {}
        for sample in self.samples:
            found[sample.outcome] = found.get(sample.outcome, 0) + 1
        return found

    def latency(self, q: float) -> float:
        return percentile([sample.seconds for sample in self.samples], q)

    @property
    def slowest(self) -> float:
        return max((sample.seconds for sample in self.samples), default=math.nan)

    @property
    def render_rate(self) -> float:
        return self.renders / self.seconds if self.seconds > 0 else math.nan


def tally(samples: Iterable[Sample], renders: Iterable[float], bounds: Boundaries) -> dict[Phase, Tally]:
    """The samples, by the phase each met (:meth:`Boundaries.phase_met`), and the renders (their
    start times), by the phase each began in; those of the warm-up, or begun after the last
    phase, are left out."""
    by_phase: dict[Phase, list[Sample]] = {phase: [] for phase in PHASES}
    for sample in samples:
        phase = bounds.phase_met(sample.start, sample.end)
        if phase is not None:
            by_phase[phase].append(sample)
    begun = dict.fromkeys(PHASES, 0)
    for start in renders:
        phase = bounds.phase_of(start)
        if phase is not None:
            begun[phase] += 1
    return {phase: Tally(by_phase[phase], begun[phase], bounds.seconds(phase)) for phase in PHASES}
