"""The Flask extension: ``Stampede(app)`` or ``Stampede()`` + ``init_app(app)``."""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlencode

from flask import Flask, Response, copy_current_request_context, current_app, g, request

import stampede
import stampede.asyncio

from ._config import SCOPES_IN_G, Settings, redis_client
from ._responses import Snapshot, Uncacheable

__all__ = ["Stampede"]

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")
logger = logging.getLogger("stampede.flask")


class _Unset:
    def __repr__(self) -> str:
        return "<the app's setting>"


#: An option left to the app's ``STAMPEDE_*`` setting.
UNSET: Any = _Unset()


@dataclass
class _State:
    """What ``init_app`` keeps in ``app.extensions["stampede"]``."""

    settings: Settings
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


def _state() -> _State:
    try:
        state: _State = current_app.extensions["stampede"]
    except KeyError:
        raise RuntimeError(
            "flask_stampede.Stampede was not initialised on this app (call init_app)"
        ) from None
    return state


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
        settings = Settings.from_config(app.config)
        client = redis_client(
            settings.redis_url, settings.redis_options, "STAMPEDE_REDIS_OPTIONS", "STAMPEDE_REDIS_URL"
        )
        try:
            core = stampede.Stampede(client, **settings.core_kwargs())
        except stampede.ConfigurationError as exc:
            named = {
                "namespace": "STAMPEDE_NAMESPACE",
                "near_cache": "STAMPEDE_NEAR_CACHE",
                "tag_check_interval": "STAMPEDE_TAG_CHECK_INTERVAL",
                "compress_above": "STAMPEDE_COMPRESS_ABOVE",
            }
            setting = named.get(str(exc).split(" ", 1)[0], "STAMPEDE_REDIS_OPTIONS")
            raise stampede.ConfigurationError(f"flask_stampede: {setting} is invalid: {exc}") from exc
        app.extensions["stampede"] = _State(settings, core)

    @property
    def stampede(self) -> stampede.Stampede:
        """The current app's :class:`stampede.Stampede`."""
        return _state().core

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
        overrides = _overrides(
            ttl=ttl,
            stale_ttl=stale_ttl,
            background=background,
            wait_timeout=wait_timeout,
            lease_ttl=lease_ttl,
            beta=beta,
        )

        read_overrides = {name: value for name, value in overrides.items() if name != "background"}

        def decorate(view: F) -> F:
            @functools.wraps(view)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                state = _state()
                if request.method not in ("GET", "HEAD") or (unless is not None and unless()):
                    return current_app.ensure_sync(view)(*args, **kwargs)
                key = _view_key(key_prefix, query_string, make_cache_key, args, kwargs)
                options = state.settings.options.merged(overrides)
                core = state.core
                page_tags = _tags_of(tags, args, kwargs)
                # The render is this view's unit of work: its lease is renewed
                # while it runs, however long that is, and settled after it.
                scope = stampede.LeaseScope()
                read = core.read(key, tags=page_tags, scope=scope, **read_overrides)
                if read.found:
                    return _replayed(read.value, state.settings, options)

                def render() -> Response:
                    # This request's unit of work: its scope gives back what
                    # is left (a lease not used to store) however it ends.
                    try:
                        return render_and_store()
                    except BaseException:
                        scope.failed = True
                        raise
                    finally:
                        core.settle(scope)

                def render_and_store() -> Response:
                    # With the lease: render, then store (fenced). Without:
                    # render for this request alone.
                    try:
                        response = current_app.make_response(current_app.ensure_sync(view)(*args, **kwargs))
                    except Exception:
                        if read.stale is None:
                            raise
                        scope.failed = True
                        logger.warning("view for %r raised; serving its stale value", key, exc_info=True)
                        return _replayed(read.stale.value, state.settings, options)
                    response.direct_passthrough = False  # send_file: read the body, to store it
                    storable = _storable(response, cache_errors) and (
                        response_filter is None or response_filter(response)
                    )
                    lease = scope.take(core, key) if storable else None
                    if lease is not None or (storable and read.unfilled):
                        snapshot = Snapshot.of(response, options.ttl)
                        if lease is not None:
                            core.commit(lease, snapshot, store_if_lapsed=True)
                        else:  # a key nobody else fills: a plain write, which ends that
                            core.set(
                                key, snapshot, ttl=options.ttl, stale_ttl=options.stale_ttl, tags=page_tags
                            )
                        _label(response, state.settings, options, "MISS", snapshot.fresh_until)
                    else:
                        # Refused for the cache (an error, a cookie...): this
                        # request's alone; the lease is given back, and until
                        # a page is stored, requests render their own.
                        _label(response, state.settings, options, "MISS", None)
                    return response

                if read.lease is not None and read.stale is not None and options.background:
                    state.refresh_in_background(_in_request_or_thread(render), key)
                    return _replayed(read.stale.value, state.settings, options)
                return render()

            return wrapper  # type: ignore[return-value]

        return decorate

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
        overrides = _overrides(
            ttl=ttl,
            stale_ttl=stale_ttl,
            background=background,
            wait_timeout=wait_timeout,
            lease_ttl=lease_ttl,
            beta=beta,
        )

        def decorate(func: F) -> F:
            if isinstance(key, str):
                fixed = key
                key_of: Callable[..., str] = lambda *args, **kwargs: fixed  # noqa: E731
            else:
                key_of = key if key is not None else stampede.function_key(func)

            def checked(result: Any) -> Any:
                if result is None and not cache_none:
                    raise Uncacheable(None)
                return result

            if inspect.iscoroutinefunction(func):

                @functools.wraps(func)
                async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                    if unless is not None and unless():
                        return await func(*args, **kwargs)

                    async def call() -> Any:
                        return checked(await func(*args, **kwargs))

                    # Inline refresh only: Flask cancels the tasks of an async
                    # view when it returns, a background task among them.
                    inline = {**overrides, "background": False, "tags": _tags_of(tags, args, kwargs)}
                    try:
                        return (
                            await _state()
                            .async_core()
                            .get_or_rebuild(key_of(*args, **kwargs), call, **inline)
                        )
                    except Uncacheable as passed:
                        return passed.result

                wrapper: Any = async_wrapper
            else:

                @functools.wraps(func)
                def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                    if unless is not None and unless():
                        return func(*args, **kwargs)
                    try:
                        return _state().core.get_or_rebuild(
                            key_of(*args, **kwargs),
                            lambda: checked(func(*args, **kwargs)),
                            tags=_tags_of(tags, args, kwargs),
                            **overrides,
                        )
                    except Uncacheable as passed:
                        return passed.result

                wrapper = sync_wrapper
            wrapper.key = key_of
            wrapper.delete = lambda *args, **kwargs: _state().core.delete(key_of(*args, **kwargs))
            wrapper.invalidate = lambda *args, **kwargs: _state().core.invalidate(key_of(*args, **kwargs))
            wrapper.uncached = func
            return wrapper  # type: ignore[no-any-return]

        return decorate

    def get_or_rebuild_many(
        self, keys: Iterable[Any], rebuild_many: Callable[[list[Any]], Any], **options: Any
    ) -> dict[Any, Any]:
        """The app's :meth:`stampede.Stampede.get_or_rebuild_many`: many keys in
        one read, the missing ones rebuilt by one call of ``rebuild_many``."""
        return _state().core.get_or_rebuild_many(keys, rebuild_many, **options)

    async def aget_or_rebuild_many(
        self, keys: Iterable[Any], rebuild_many: Callable[[list[Any]], Any], **options: Any
    ) -> dict[Any, Any]:
        """:meth:`get_or_rebuild_many` for async views (``rebuild_many`` may be a
        coroutine function)."""
        return await _state().async_core().get_or_rebuild_many(keys, rebuild_many, **options)

    # --- groups ---------------------------------------------------------------------

    def invalidate_tags(self, *tags: str) -> None:
        """Mark every page and result carrying any of ``tags`` stale, in every
        process: each is served stale while one request refreshes it. One
        Redis command per tag, however many entries carry it."""
        _state().core.invalidate_tags(*tags)

    def delete_tags(self, *tags: str) -> None:
        """Make every page and result carrying any of ``tags`` read as missing:
        one request renders each while the others wait."""
        _state().core.delete_tags(*tags)

    def invalidate_all(self) -> None:
        """Mark everything of this app's namespace stale, softly, in one command."""
        _state().core.invalidate_all()

    def delete_memoized(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        """Forget a memoized function's results: for these arguments, or,
        with none, for every call. Returns how many were deleted."""
        target = getattr(func, "uncached", func)
        key_of = stampede.function_key(target)
        core = _state().core
        if args or kwargs:
            return int(core.delete(key_of(*args, **kwargs)))
        return core.delete_prefix(f"{target.__module__}.{target.__qualname__}(")


def _tags_of(
    tags: Sequence[str] | Callable[..., Sequence[str]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Sequence[str]:
    """A decorator's tags for one call: given, or computed from the call's arguments."""
    return tags(*args, **kwargs) if callable(tags) else tags


def _overrides(**values: Any) -> dict[str, Any]:
    """The options a decorator sets (the others follow the app's settings),
    checked now so that a bad one fails at decoration, naming the option."""
    given = {name: value for name, value in values.items() if value is not UNSET}
    stampede.Options().merged(given)
    return given


# Statuses stored by default: complete responses, the same for every request
# (RFC 9111's heuristically cacheable ones, less the errors). Never 206 or 304.
_STORED_STATUSES = frozenset({200, 203, 300, 301, 308})


def _storable(response: Response, cache_errors: bool) -> bool:
    status = response.status_code
    if status not in _STORED_STATUSES and not (cache_errors and status >= 400):
        return False
    if "Set-Cookie" in response.headers:
        return False  # one visitor's cookie must never be replayed to others
    control = response.cache_control
    return not (control.private or control.no_store)


def _in_request_or_thread(render: Callable[[], R]) -> Callable[[], R]:
    """``render`` for a background refresh: in this request's own thread as
    it is; in another thread, under a copy of the request context and with
    this request's ``g``, since the request will have ended by then."""
    request_thread = threading.current_thread()
    # The request's lease scopes stay the request's: a scope is one unit of
    # work's, and the request's teardown settles them.
    state_of_g = {name: value for name, value in vars(g).items() if name != SCOPES_IN_G}

    @copy_current_request_context
    def in_copy() -> R:
        vars(g).update(state_of_g)
        return render()

    def rebuild() -> R:
        return render() if threading.current_thread() is request_thread else in_copy()

    return rebuild


def _view_key(
    prefix: str | Callable[[], str],
    query_string: bool,
    make_cache_key: Callable[..., str] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> str:
    if make_cache_key is not None:
        return make_cache_key(*args, **kwargs)
    key = prefix() if callable(prefix) else (prefix % request.path if "%s" in prefix else prefix)
    if query_string:
        query = urlencode(sorted(request.args.items(multi=True)))
        key += "?" + (query if len(query) <= 200 else "sha256:" + hashlib.sha256(query.encode()).hexdigest())
    return key


def _replayed(snapshot: Snapshot, settings: Settings, options: stampede.Options) -> Response:
    """A stored page as this request's response; 304 for a matching validator."""
    response = snapshot.response()
    _label(response, settings, options, "HIT" if snapshot.fresh() else "STALE", snapshot.fresh_until)
    response.make_conditional(request)  # in place
    return response


def _label(
    response: Response, settings: Settings, options: stampede.Options, verdict: str, fresh_until: float | None
) -> None:
    """The opt-in headers: what happened, and (for stored pages) RFC 5861's
    freshness directives, unless the view set its own Cache-Control."""
    if settings.cache_header:
        response.headers[settings.cache_header] = verdict
    stored = fresh_until is not None and fresh_until != float("inf")
    if settings.cache_control and stored and "Cache-Control" not in response.headers:
        assert fresh_until is not None
        max_age = max(0, int(fresh_until - time.time()))
        directives = [f"max-age={max_age}"]
        if options.stale_ttl:
            stale = int(options.stale_ttl)
            directives += [f"stale-while-revalidate={stale}", f"stale-if-error={stale}"]
        response.headers["Cache-Control"] = ", ".join(directives)
