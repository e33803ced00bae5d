"""The Flask extension: ``Stampede(app)`` or ``Stampede()`` + ``init_app(app)``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from flask import Flask, Response

import stampede

from ._command import stampede_command
from ._config import StampedeConfig, setting_of
from ._memoize import memoized
from ._redis import redis_client
from ._state import UNSET, AppState, overrides, state
from ._views import cached_view

__all__ = ["Stampede"]

F = TypeVar("F", bound=Callable[..., Any])


class Stampede:
    """Stampede-protected caching for Flask views and functions.

    Keeps no app: state lives in ``app.extensions["stampede"]``, so one
    instance serves any number of apps.

    Settings, read and checked at :meth:`init_app` (an unknown or invalid one
    raises :class:`stampede.ConfigurationError` naming it, with the known
    name closest to a misspelt one):

    - ``STAMPEDE_REDIS_URL`` (else the ``STAMPEDE_REDIS_URL`` or ``REDIS_URL``
      environment variable): ``redis://``, ``rediss://``, ``unix://``,
      ``redis+cluster://`` or ``redis+sentinel://``.
    - ``STAMPEDE_REDIS_OPTIONS``: a dict of redis-py's connection keyword
      arguments (``socket_timeout``, ``ssl_ca_certs``, ``max_connections``...;
      socket timeouts default to 5 s), checked against what redis-py takes.
    - stampede's options: ``STAMPEDE_TTL``, ``STAMPEDE_STALE_TTL``,
      ``STAMPEDE_LEASE_TTL``, ``STAMPEDE_MAX_LEASE_TIME``,
      ``STAMPEDE_WAIT_TIMEOUT``, ``STAMPEDE_ON_WAIT_TIMEOUT``,
      ``STAMPEDE_BACKGROUND``, ``STAMPEDE_BETA``, ``STAMPEDE_FAIL_OPEN``,
      ``STAMPEDE_UNFILLED_TTL``, ``STAMPEDE_MAX_VALUE_SIZE`` (those of :class:`stampede.Options`);
      ``STAMPEDE_NAMESPACE`` (default ``"flask"``), ``STAMPEDE_SERIALIZER``
      (default ``"pickle"``), ``STAMPEDE_ON_EVENT``, ``STAMPEDE_NEAR_CACHE``,
      ``STAMPEDE_TAG_CHECK_INTERVAL``, ``STAMPEDE_COMPRESS_ABOVE``.
    - ``STAMPEDE_SIGNING_KEY``: absent, values are signed with keys derived
      from the app's ``SECRET_KEY`` (then ``SECRET_KEY_FALLBACKS``), or, in an
      app without a ``SECRET_KEY``, stored unsigned with a warning; ``None`` or
      ``False``: stored unsigned, without a warning, as with Django's
      ``OPTIONS["SIGNING_KEY"] = None`` (for a Redis no one else can write
      to); a key (16 bytes or more) or a list of them: signed with those.
    - ``STAMPEDE_CACHE_HEADER`` (a header name saying ``HIT``, ``STALE`` or
      ``MISS``) and ``STAMPEDE_CACHE_CONTROL`` (``True``: send RFC 5861's
      ``Cache-Control``).
    """

    def __init__(self, app: Flask | None = None) -> None:
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read and check the app's ``STAMPEDE_*`` settings (errors name the
        setting) and connect; the connection pool opens lazily."""
        settings = StampedeConfig.from_config(app.config)
        client = redis_client(
            settings.redis_url, settings.redis_options, "STAMPEDE_REDIS_OPTIONS", "STAMPEDE_REDIS_URL"
        )
        try:
            core = stampede.Stampede(client, **settings.core_kwargs())
        except stampede.ConfigurationError as exc:
            # The client's own refusals (decode_responses...) are of STAMPEDE_REDIS_OPTIONS.
            setting = setting_of(exc, "STAMPEDE_REDIS_OPTIONS")
            raise stampede.ConfigurationError(f"flask_stampede: {setting} is invalid: {exc}") from exc
        app.extensions["stampede"] = AppState(settings, core)
        app.cli.add_command(stampede_command)  # flask stampede ...

    @property
    def stampede(self) -> stampede.Stampede:
        """The current app's :class:`stampede.Stampede`."""
        return state().core

    # --- views --------------------------------------------------------------------

    def cached(
        self,
        ttl: float | None = UNSET,
        stale_ttl: float = UNSET,
        *,
        key_prefix: str | Callable[[], str] = "view/%s",
        query_string: bool = False,
        unless: Callable[[], bool] | None = None,
        response_filter: Callable[[Response], bool] | None = None,
        make_cache_key: Callable[..., str] | None = None,
        cache_errors: bool = False,
        background: bool = UNSET,
        wait_timeout: float = UNSET,
        lease_ttl: float = UNSET,
        beta: float | None = UNSET,
        tags: Sequence[str] | Callable[..., Sequence[str]] = (),
    ) -> Callable[[F], F]:
        """Cache a view's whole response (status, headers, body), one render
        per expiry across every process.

        Keyed by ``key_prefix`` (``%s``: the request path) and, with
        ``query_string``, the query arguments in any order; or by
        ``make_cache_key(*view_args)``. ``unless()`` true: bypass the cache.
        Responses with status 400 and above, that set cookies, or that
        ``response_filter`` refuses are served but not stored (stale-if-error:
        a stale copy is served instead while one exists). Sync and async
        views alike; background refreshes run in threads with a copy of the
        request context. ``tags``: the groups the page belongs to, or a
        function of the view's arguments returning them (see
        :meth:`invalidate_tags`).
        """
        return cached_view(
            overrides(
                ttl=ttl,
                stale_ttl=stale_ttl,
                background=background,
                wait_timeout=wait_timeout,
                lease_ttl=lease_ttl,
                beta=beta,
            ),
            key_prefix=key_prefix,
            query_string=query_string,
            unless=unless,
            response_filter=response_filter,
            make_cache_key=make_cache_key,
            cache_errors=cache_errors,
            tags=tags,
        )

    # --- functions ------------------------------------------------------------------

    def memoize(
        self,
        ttl: float | None = UNSET,
        stale_ttl: float = UNSET,
        *,
        unless: Callable[[], bool] | None = None,
        cache_none: bool = False,
        key: str | Callable[..., str] | None = None,
        background: bool = UNSET,
        wait_timeout: float = UNSET,
        lease_ttl: float = UNSET,
        beta: float | None = UNSET,
        tags: Sequence[str] | Callable[..., Sequence[str]] = (),
    ) -> Callable[[F], F]:
        """Cache a function's results per arguments (sync or async functions),
        one call per expiry across every process.

        Keys come from the function's module, name and arguments (their
        ``repr``), or from ``key`` (a string, or a function of the same
        arguments). ``cache_none``: whether a ``None`` result is stored.
        ``False``, the default (as Flask-Caching's ``memoize``): ``None`` is
        returned but never stored, so a function that returns ``None`` runs
        again on every call, as if not memoized (return a sentinel of your
        own to cache "nothing found"); ``True``: ``None`` is stored and served
        like any other result. Async functions refresh inline: Flask cancels an async view's tasks
        when it returns. The function gains ``delete(*args)`` and
        ``invalidate(*args)``; see also :meth:`delete_memoized`. ``tags``: the
        groups a result belongs to, or a function of the same arguments
        returning them (see :meth:`invalidate_tags`).
        """
        return memoized(
            overrides(
                ttl=ttl,
                stale_ttl=stale_ttl,
                background=background,
                wait_timeout=wait_timeout,
                lease_ttl=lease_ttl,
                beta=beta,
            ),
            unless=unless,
            cache_none=cache_none,
            key=key,
            tags=tags,
        )

    def get_or_rebuild_many(
        self, keys: Iterable[Any], rebuild_many: Callable[[list[Any]], Any], **options: Any
    ) -> dict[Any, Any]:
        """The app's :meth:`stampede.Stampede.get_or_rebuild_many`: many keys in
        one read, the missing ones rebuilt by one call of ``rebuild_many``."""
        return state().core.get_or_rebuild_many(keys, rebuild_many, **options)

    async def aget_or_rebuild_many(
        self, keys: Iterable[Any], rebuild_many: Callable[[list[Any]], Any], **options: Any
    ) -> dict[Any, Any]:
        """:meth:`get_or_rebuild_many` for async views (``rebuild_many`` may be a
        coroutine function)."""
        return await state().async_core().get_or_rebuild_many(keys, rebuild_many, **options)

    # --- groups ---------------------------------------------------------------------

    def invalidate_tags(self, *tags: str) -> None:
        """Mark every page and result carrying any of ``tags`` stale, in every
        process: each is served stale while one request refreshes it. One
        Redis command per tag, however many entries carry it."""
        state().core.invalidate_tags(*tags)

    def delete_tags(self, *tags: str) -> None:
        """Make every page and result carrying any of ``tags`` read as missing:
        one request renders each while the others wait."""
        state().core.delete_tags(*tags)

    def invalidate_all(self) -> None:
        """Mark everything of this app's namespace stale, softly, in one command."""
        state().core.invalidate_all()

    def delete_memoized(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        """Forget a memoized function's results: for these arguments, or,
        with none, for every call. Returns how many were deleted."""
        target = getattr(func, "uncached", func)
        key_of = stampede.function_key(target)
        core = state().core
        if args or kwargs:
            return int(core.delete(key_of(*args, **kwargs)))
        return core.delete_prefix(f"{target.__module__}.{target.__qualname__}(")
