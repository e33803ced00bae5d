"""An update in place of a signed value (``incr``, ``touch``), by
compare-and-set: only a client can sign, so the new value is made here and
swapped in if the value is still the one it was made from."""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from typing import Any

from .._exceptions import StampedeError
from .keys import Keys
from .ops import Op, Reread, Sleep, Swap
from .settings import Settings

__all__ = ["SWAP_BACKOFF", "SWAP_MAX_BACKOFF", "swapped"]

#: The first pause (s) of an update that another write overtook.
SWAP_BACKOFF = 0.001
#: Its longest: a loser must keep trying while others write, within ``wait_timeout``.
SWAP_MAX_BACKOFF = 0.05


def swapped(
    settings: Settings, keys: Keys, change: Callable[[bytes], tuple[bytes, str]]
) -> Generator[Op, Any, bytes | None]:
    """Replace the signed value of ``keys`` with ``change(value)`` (the new
    bytes and SWAP's expiry argument). Returns the value it changed, or
    ``None`` when there was none that verifies; raises when other processes'
    writes kept coming first for ``wait_timeout``."""
    clock = settings.clock
    wait_timeout = settings.options.wait_timeout
    raw = yield Reread()
    deadline = clock.monotonic() + wait_timeout
    pause = SWAP_BACKOFF
    while True:
        if raw is None or settings.judge.decode(keys, raw) is None:  # absent, or forged: a miss
            return None
        new, expire = change(raw)
        if (yield Swap(raw, new, expire)):
            return raw  # type: ignore[no-any-return]
        if clock.monotonic() + pause > deadline:
            raise StampedeError(
                f"key {keys.name!r} kept changing under this update for wait_timeout ({wait_timeout:g}s)"
            )
        # Another process's write came first: try again after a random
        # pause, so that updaters in many processes do not keep colliding,
        # from the value as it is after the pause (the one the refusal
        # carried is older by then: retried with it, a loser would never
        # win while others keep writing).
        yield Sleep(random.uniform(0, pause))
        pause = min(pause * 2, SWAP_MAX_BACKOFF)
        raw = yield Reread()
