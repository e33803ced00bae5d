"""``Stampede.cached``: a view's whole response (status, headers, body)
cached, one render per expiry across every process, replayed to the
others; stale-while-revalidate and stale-if-error."""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlencode

from flask import Response, copy_current_request_context, current_app, g, request

import stampede

from ._config import SCOPES_IN_G, StampedeConfig
from ._responses import Snapshot
from ._state import logger, state, tags_of

__all__ = ["cached_view"]

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")


def cached_view(
    overrides: dict[str, Any],
    *,
    key_prefix: str | Callable[[], str],
    query_string: bool,
    unless: Callable[[], bool] | None,
    response_filter: Callable[[Response], bool] | None,
    make_cache_key: Callable[..., str] | None,
    cache_errors: bool,
    tags: Sequence[str] | Callable[..., Sequence[str]],
) -> Callable[[F], F]:
    """The decorator of :meth:`flask_stampede.Stampede.cached`, with the
    options it sets (``overrides``) checked."""
    read_overrides = {name: value for name, value in overrides.items() if name != "background"}

    def decorate(view: F) -> F:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            app = state()
            if request.method not in ("GET", "HEAD") or (unless is not None and unless()):
                return current_app.ensure_sync(view)(*args, **kwargs)
            key = _view_key(key_prefix, query_string, make_cache_key, args, kwargs)
            options = app.settings.options.merged(overrides)
            core = app.core
            page_tags = tags_of(tags, args, kwargs)
            # The render is this view's unit of work: its lease is renewed
            # while it runs, however long that is, and settled after it.
            scope = stampede.LeaseScope()
            read = core.read(key, tags=page_tags, scope=scope, **read_overrides)
            if read.found:
                return _replayed(read.value, app.settings, options)

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
                    return _replayed(read.stale.value, app.settings, options)
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
                        core.set(key, snapshot, ttl=options.ttl, stale_ttl=options.stale_ttl, tags=page_tags)
                    _label(response, app.settings, options, "MISS", snapshot.fresh_until)
                else:
                    # Refused for the cache (an error, a cookie...): this
                    # request's alone; the lease is given back, and until
                    # a page is stored, requests render their own.
                    _label(response, app.settings, options, "MISS", None)
                return response

            if read.lease is not None and read.stale is not None and options.background:
                app.refresh_in_background(_in_request_or_thread(render), key)
                return _replayed(read.stale.value, app.settings, options)
            return render()

        return wrapper  # type: ignore[return-value]

    return decorate


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


def _replayed(snapshot: Snapshot, settings: StampedeConfig, options: stampede.Options) -> Response:
    """A stored page as this request's response; 304 for a matching validator."""
    response = snapshot.response()
    _label(response, settings, options, "HIT" if snapshot.fresh() else "STALE", snapshot.fresh_until)
    response.make_conditional(request)  # in place
    return response


def _label(
    response: Response,
    settings: StampedeConfig,
    options: stampede.Options,
    verdict: str,
    fresh_until: float | None,
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
