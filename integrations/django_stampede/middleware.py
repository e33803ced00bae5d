"""``CacheHeaderMiddleware``: an ``X-Cache`` header on the pages of Django's
cache middleware and ``cache_page``, saying ``HIT``, ``STALE`` or ``MISS``.

.. code-block:: python

    MIDDLEWARE = [
        "django_stampede.middleware.CacheHeaderMiddleware",  # first: above UpdateCacheMiddleware
        "django.middleware.cache.UpdateCacheMiddleware",
        ...,
        "django.middleware.cache.FetchFromCacheMiddleware",
    ]
    STAMPEDE_CACHE_HEADER = "X-Cache"  # the default
    CACHES["default"]["OPTIONS"]["RECORD_CALLS"] = True  # the cache the pages are in
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest, HttpResponseBase

from ._errors import bad
from ._outcomes import page_verdict
from ._recording import Recorder, recording

__all__ = ["CacheHeaderMiddleware"]

#: A header name: an RFC 9110 token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class CacheHeaderMiddleware:
    """Labels each response that Django's cache middleware or ``cache_page``
    looked up: ``HIT`` (served from the cache, fresh), ``STALE`` (served
    stale while another request renders it again) or ``MISS`` (rendered by
    this request), under the header ``settings.STAMPEDE_CACHE_HEADER``
    (``"X-Cache"`` by default). Other responses are left alone.

    Place it first in ``MIDDLEWARE``, above ``UpdateCacheMiddleware``: it
    labels a page once stored, so that the stored copy carries no label.
    The cache the pages are stored in needs ``OPTIONS["RECORD_CALLS"] =
    True``: the label is read from the record of the request's calls, which
    costs that cache an event per call. Sync and async."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.header = _header_name()
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        with recording() as recorder:
            response = self.get_response(request)
        return self._labelled(response, recorder)

    async def __acall__(self, request: HttpRequest) -> Any:
        get_response: Callable[[HttpRequest], Awaitable[Any]] = self.get_response
        with recording() as recorder:
            response = await get_response(request)
        return self._labelled(response, recorder)

    def _labelled(self, response: HttpResponseBase, recorder: Recorder) -> HttpResponseBase:
        verdict = page_verdict(recorder.calls)
        if verdict is not None:
            response[self.header] = verdict
        return response


def _header_name() -> str:
    """``settings.STAMPEDE_CACHE_HEADER``, checked; and some cache records its calls."""
    header = getattr(settings, "STAMPEDE_CACHE_HEADER", "X-Cache")
    if not isinstance(header, str) or not _TOKEN.fullmatch(header):
        raise bad(
            "settings.STAMPEDE_CACHE_HEADER", f"must be a header name such as 'X-Cache', got {header!r}"
        )
    if not any((entry.get("OPTIONS") or {}).get("RECORD_CALLS") for entry in caches.settings.values()):
        raise bad(
            "settings.MIDDLEWARE",
            "has django_stampede.middleware.CacheHeaderMiddleware, which reads what the cache did "
            "from the record of the request's calls, and no cache records them: set "
            "OPTIONS['RECORD_CALLS'] = True on the CACHES entry the pages are stored in",
        )
    return header
