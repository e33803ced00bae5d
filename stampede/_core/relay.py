"""One machine's steps carried out inside another's: each operation it asks
for passed on (as it is, or changed, or watched on the way), and the reply
or the failure sent back to it. No I/O here."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from .ops import Op

__all__ = ["Stop", "relayed"]


class Stop(NamedTuple):
    """What a relay's ``step`` returns to end it: the relay returns ``value``
    and the relayed machine is closed, the operation it asked for unasked."""

    value: Any


def relayed(steps: Generator[Op, Any, Any], step: Callable[[Op], Op | Stop]) -> Generator[Op, Any, Any]:
    """Carry ``steps`` out, each operation it asks for given to ``step``
    first, which returns the operation to ask instead (or :class:`Stop`).
    Returns what ``steps`` returns."""
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            op = steps.throw(failure) if failure is not None else steps.send(reply)
        except StopIteration as stop:
            return stop.value
        passed = step(op)
        if isinstance(passed, Stop):
            steps.close()
            return passed.value
        try:
            reply, failure = (yield passed), None
        except GeneratorExit:  # closed unfinished: so is the machine relayed
            steps.close()
            raise
        except BaseException as exc:
            reply, failure = None, exc
