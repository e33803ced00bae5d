"""The circuit breaker of one Redis server in one process: after a call found
the server unreachable, the calls that follow skip it for a short, growing,
jittered pause, after which one probe at a time tries it again, sent by the
instance beside its callers, never by a caller.

A Redis that is down, refusing connections or dropping packets then costs a
request about nothing, not a connection attempt or a socket timeout each (a
probe of a server that drops packets waits out a socket timeout: no caller
waits with it); the probe that succeeds closes the breaker. Only an outage opens it (a
connection refused, reset or timed out, a server still loading its data):
a refusal the server answered (``OOM``, ``READONLY``, a wrong password) is
no sign that the next call will fail, and is left to the caller.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from .clock import Clock

__all__ = ["FIRST_PAUSE", "LONGEST_PAUSE", "Breaker"]

#: How long calls skip Redis after the first failure; each failed probe
#: doubles it, up to the longest.
FIRST_PAUSE = 0.1
LONGEST_PAUSE = 1.0
#: How far each pause is moved at random (a fraction of it), so that the
#: processes of a fleet do not probe a recovering Redis all at once.
JITTER = 0.25


class Breaker:
    """Whether calls may go to one Redis server now.

    Closed (:attr:`tripped` is ``False``), every call goes. After a failure
    it opens: every call is refused. Once its pause is over, :meth:`probe_due`
    says so to one caller, which has the probe sent (beside it, not by it);
    the probe's success closes it, its failure opens it again for twice as
    long (at most :data:`LONGEST_PAUSE`). A probe that never reports is
    replaced after one more pause.

    ``on_change(opened, error)``: told when it opens (``True``, with the
    failure) and closes again (``False``), from the thread of the call
    concerned; once per change, however many calls fail meanwhile.

    Thread-safe; :attr:`tripped` is read without the lock, on every call.
    """

    def __init__(
        self,
        clock: Clock,
        on_change: Callable[[bool, BaseException | None], None] | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self._clock = clock
        self._on_change = on_change
        self._random = (rng or random.Random()).random
        self._lock = threading.Lock()
        #: Whether calls are being refused (open) or probing (half-open).
        self.tripped = False
        #: The failure that opened it, or that the last probe met.
        self.error: BaseException | None = None
        self._pause = FIRST_PAUSE
        self._retry_at = 0.0  # monotonic: when the next probe may go
        self._probe_until = 0.0  # monotonic: a probe out is awaited until then

    def probe_due(self) -> bool:
        """Whether a probe should be sent now: the breaker is open, its pause
        is over and no probe is out (``True`` once per pause: the caller that
        is told has it sent)."""
        if not self.tripped:
            return False
        now = self._clock.monotonic()
        with self._lock:
            if not self.tripped or now < self._retry_at or now < self._probe_until:
                return False
            # Another may go if this one never reports.
            self._probe_until = now + self._pause
            return True

    def retry_in(self) -> float:
        """Seconds until the next probe may go (``0`` when closed)."""
        if not self.tripped:
            return 0.0
        return max(0.0, self._retry_at - self._clock.monotonic())

    def succeeded(self) -> None:
        """The probe reached the server: close (a no-op when closed)."""
        if not self.tripped:
            return
        with self._lock:
            if not self.tripped:
                return
            self.tripped = False
            self._pause = FIRST_PAUSE
            self._probe_until = 0.0
        if self._on_change is not None:
            self._on_change(False, None)

    def failed(self, error: BaseException) -> None:
        """A call found the server unreachable: open, or stay open longer
        when it was the probe."""
        now = self._clock.monotonic()
        with self._lock:
            opened = not self.tripped
            if opened:
                pause = FIRST_PAUSE
            elif now >= self._retry_at:
                # A probe failed (or a call that went before the pause began
                # ended now): wait longer before the next.
                pause = min(self._pause * 2, LONGEST_PAUSE)
            else:
                return  # calls that went before it opened, failing one by one
            self._pause = pause
            self.error = error
            self._retry_at = now + pause * (1 + JITTER * (2 * self._random() - 1))
            self._probe_until = 0.0
            self.tripped = True
        if opened and self._on_change is not None:
            self._on_change(True, error)
