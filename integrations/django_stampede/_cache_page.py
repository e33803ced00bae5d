"""``cache_page`` for async views: Django's, with the cache awaited.

Django's own ``cache_page`` calls the cache's blocking ``get`` and ``set`` even
for a coroutine view, on the event loop's thread. A backend that waits there
for another request's rebuild would stop every request of the server, so
``StampedeCache`` cannot coalesce those pages; this decorator reads and writes
them with ``aget`` and ``aset``, where waiting costs nothing but the request's
own time. Sync views get Django's decorator itself.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.middleware.cache import CacheMiddleware
from django.utils.cache import (
    _generate_cache_header_key,
    _generate_cache_key,
    get_max_age,
    has_vary_header,
    patch_response_headers,
    patch_vary_headers,
)
from django.utils.http import parse_http_date_safe

try:
    from django.utils.http import split_header_value as _split_header_value
except ImportError:  # Django 5.2
    _split_header_value = None
from django.views.decorators.cache import cache_page as django_cache_page

from .cache import PAGE_TAGS

__all__ = ["cache_page"]

_View = TypeVar("_View", bound=Callable[..., Any])


def cache_page(
    timeout: float | None,
    *,
    cache: str | None = None,
    key_prefix: str | None = None,
    tags: Sequence[str] | Callable[..., Sequence[str]] | None = None,
) -> Callable[[_View], _View]:
    """Cache a view's page as Django's ``cache_page`` does, with the same
    arguments and rules; for a coroutine view, through the cache's async API.

    With ``django_stampede.StampedeCache`` concurrent requests for an async
    view's page are then coalesced: a missing page is rendered once while the
    others wait for it, a stale page once while the others get the stale one.

    ``tags``: the groups the page belongs to, or a function of the view's
    arguments (``request, *args, **kwargs``) that returns them, so that
    ``cache.invalidate_tags(...)`` marks the page stale (rendered again once,
    served stale meanwhile) when what it shows changes.
    """
    if tags is not None and not callable(tags):
        if isinstance(tags, str) or not all(isinstance(tag, str) and tag for tag in tags):
            raise ImproperlyConfigured(
                "cache_page(tags=...) takes a list of non-empty str, or a function of the "
                f"view's arguments returning one; got {tags!r}"
            )
    stock = django_cache_page(timeout, cache=cache, key_prefix=key_prefix)

    def decorator(view: _View) -> _View:
        if tags is not None:
            view = _tagging(view, tags)
        if not iscoroutinefunction(view):
            return cast(_View, stock(view))
        # Django's middleware for its settings (defaults, alias, prefix) and
        # its hook _should_update_cache; its blocking I/O only for template
        # responses, below.
        middleware = CacheMiddleware(view, page_timeout=timeout, cache_alias=cache, key_prefix=key_prefix)

        @wraps(view)
        async def cached_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            hit = await _fetch(middleware, request)
            if hit is not None:
                return hit
            response = await view(request, *args, **kwargs)
            if callable(getattr(response, "render", None)):
                # A template response is stored by Django's own code once
                # rendered, in the worker thread Django renders it in: sets
                # only, which never wait for a lease.
                response.add_post_render_callback(lambda page: middleware.process_response(request, page))
                return response
            return await _update(middleware, request, response)

        return cast(_View, cached_view)

    return decorator


def _tagging(view: _View, tags: Sequence[str] | Callable[..., Sequence[str]]) -> _View:
    """``view``, its responses marked with the tags the cache stores them with."""

    def mark(response: Any, request: HttpRequest, args: Any, kwargs: Any) -> Any:
        setattr(response, PAGE_TAGS, tuple(tags(request, *args, **kwargs) if callable(tags) else tags))
        return response

    if iscoroutinefunction(view):

        @wraps(view)
        async def tagged_async(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return mark(await view(request, *args, **kwargs), request, args, kwargs)

        return cast(_View, tagged_async)

    @wraps(view)
    def tagged(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return mark(view(request, *args, **kwargs), request, args, kwargs)

    return cast(_View, tagged)


async def _fetch(middleware: Any, request: HttpRequest) -> Any:
    """The cached page for ``request``, or ``None``; marks whether the
    response to come should be stored."""
    if request.method not in ("GET", "HEAD"):
        request._cache_update_cache = False
        return None
    cache = middleware.cache
    key = await _aget_cache_key(request, middleware.key_prefix, "GET", cache)
    if key is None:
        request._cache_update_cache = True
        return None
    response = await cache.aget(key)
    if response is None and request.method == "HEAD":
        # No GET page: perhaps a page stored by an earlier HEAD request.
        key = await _aget_cache_key(request, middleware.key_prefix, "HEAD", cache)
        response = None if key is None else await cache.aget(key)
    if response is None:
        request._cache_update_cache = True
        return None
    max_age = get_max_age(response)
    expires = parse_http_date_safe(response.get("Expires")) if max_age is not None else None
    if expires is not None:
        # Seconds the page has spent in the cache; never negative if the clock went back.
        response["Age"] = max(0, max_age - (expires - int(time.time())))
    request._cache_update_cache = False
    return response


async def _update(middleware: Any, request: HttpRequest, response: Any) -> Any:
    """Store ``response`` if Django's cache middleware would, and return it."""
    if not middleware._should_update_cache(request, response):
        return response
    if response.streaming or response.status_code not in (200, 304):
        return response
    if response.cookies and has_vary_header(response, "Cookie"):
        return response  # a cookie of this user's own, on a page that varies by cookie
    cache_control = response.get("Cache-Control", "").lower()
    if any(directive in cache_control for directive in ("private", "no-cache", "no-store")):
        return response
    if has_vary_header(response, "*"):
        return response
    # The decorator's timeout wins; without one, the page's max-age (0: do not
    # store), then the middleware's default.
    timeout = middleware.page_timeout
    if timeout is None:
        timeout = get_max_age(response)
        if timeout is None:
            timeout = middleware.cache_timeout
        elif timeout == 0:
            return response
    patch_response_headers(response, timeout)
    if request.headers.get("Authorization") and "public" not in cache_control:
        # One user's authorized page must not be served to another (RFC 9111, 3.5).
        patch_vary_headers(response, ("Authorization",))
    if timeout and response.status_code == 200:
        cache = middleware.cache
        key = await _alearn_cache_key(request, response, timeout, middleware.key_prefix, cache)
        await cache.aset(key, response, timeout)
    return response


async def _aget_cache_key(request: HttpRequest, key_prefix: str, method: str, cache: Any) -> str | None:
    """``django.utils.cache.get_cache_key``, awaiting the cache: the page's key
    from the stored list of headers it varies on, or ``None`` if none is stored."""
    headerlist = await cache.aget(_generate_cache_header_key(key_prefix, request))
    if headerlist is None:
        return None
    return cast(str, _generate_cache_key(request, method, headerlist, key_prefix))


async def _alearn_cache_key(
    request: HttpRequest, response: Any, timeout: float, key_prefix: str, cache: Any
) -> str:
    """``django.utils.cache.learn_cache_key``, awaiting the cache: store the
    headers the page varies on and return the key to store the page under."""
    headerlist = _vary_headerlist(response)
    await cache.aset(_generate_cache_header_key(key_prefix, request), headerlist, timeout)
    return cast(str, _generate_cache_key(request, request.method, headerlist, key_prefix))


def _vary_names(value: str) -> list[str]:
    """The header names in a ``Vary`` value, split as the running Django splits them."""
    if _split_header_value is not None:  # Django 6
        return list(_split_header_value(value))
    return re.split(r"\s*,\s*", value)  # Django 5.2's cc_delim_re


def _vary_headerlist(response: Any) -> list[str]:
    """The ``request.META`` names of the headers in the response's ``Vary``, sorted."""
    if not response.has_header("Vary"):
        return []
    names = []
    for header in _vary_names(response.headers["Vary"]):
        name = header.upper().replace("-", "_")
        # With i18n the language is in the key already: varying on the raw
        # header too would store one copy of the page per browser.
        if name != "ACCEPT_LANGUAGE" or not settings.USE_I18N:
            names.append("HTTP_" + name)
    return sorted(names)
