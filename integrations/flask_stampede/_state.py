"""What the extension keeps per app (``app.extensions["stampede"]``), and
what its decorators share: the options they set, the tags of a call."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from flask import current_app

import stampede
import stampede.asyncio

from ._config import StampedeConfig
from ._redis import redis_client

__all__ = ["UNSET", "AppState", "overrides", "state", "tags_of"]

logger = logging.getLogger("stampede.flask")


class _Unset:
    def __repr__(self) -> str:
        return "<the app's setting>"


#: An option left to the app's ``STAMPEDE_*`` setting.
UNSET: Any = _Unset()


@dataclass
class AppState:
    """What ``init_app`` keeps in ``app.extensions["stampede"]``."""

    settings: StampedeConfig
    core: stampede.Stampede
    _refreshers: ThreadPoolExecutor | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh_in_background(self, refresh: Callable[[], Any], key: str) -> None:
        """Run ``refresh`` in a worker thread (Flask would cancel a task)."""

        def run() -> None:
            try:
                refresh()
            except Exception:
                logger.warning("background refresh of %r failed", key, exc_info=True)

        with self._lock:
            if self._refreshers is None:
                self._refreshers = ThreadPoolExecutor(4, thread_name_prefix="stampede-flask-refresh")
            self._refreshers.submit(run)

    def async_core(self) -> stampede.asyncio.Stampede:
        settings = self.settings

        def build() -> stampede.asyncio.Stampede:
            client = redis_client(
                settings.redis_url,
                settings.redis_options,
                "STAMPEDE_REDIS_OPTIONS",
                "STAMPEDE_REDIS_URL",
                asynchronous=True,
            )
            # No near cache: Flask runs each async view or function on an event
            # loop of its own, where one would start empty and cost a
            # connection (CLIENT TRACKING) per call. Coherent all the same:
            # the blocking core's copies are dropped on this one's writes.
            return stampede.asyncio.Stampede(client, **settings.core_kwargs(near=False))

        return stampede.asyncio.for_running_loop(id(self), build)


def state() -> AppState:
    """The current app's state, or an error saying to call ``init_app``."""
    try:
        found: AppState = current_app.extensions["stampede"]
    except KeyError:
        raise RuntimeError(
            "flask_stampede.Stampede was not initialised on this app (call init_app)"
        ) from None
    return found


def tags_of(
    tags: Sequence[str] | Callable[..., Sequence[str]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Sequence[str]:
    """A decorator's tags for one call: given, or computed from the call's arguments."""
    return tags(*args, **kwargs) if callable(tags) else tags


def overrides(**values: Any) -> dict[str, Any]:
    """The options a decorator sets (the others follow the app's settings),
    checked now so that a bad one fails at decoration, naming the option."""
    given = {name: value for name, value in values.items() if value is not UNSET}
    stampede.Options().merged(given)
    return given
