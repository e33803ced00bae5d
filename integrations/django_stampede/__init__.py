"""Stampede protection for Django's cache framework.

.. code-block:: python

    CACHES = {
        "default": {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": "redis://127.0.0.1:6379/0",
            "TIMEOUT": 300,
            "OPTIONS": {"STALE_TTL": 600},
        }
    }

``django_stampede.cache_page`` is Django's ``cache_page`` that awaits the
cache for async views, so that their pages are coalesced too.
``django_stampede.lease_scope()`` makes a unit of work outside a request (a
Celery task, a management command) hold and renew the leases its ``get``
misses take, as a request does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._leases import lease_scope as lease_scope
from .cache import StampedeCache as StampedeCache

if TYPE_CHECKING:
    from ._cache_page import cache_page as cache_page
else:

    def __getattr__(name: str) -> object:
        """``cache_page`` imported at its first use (PEP 562): it brings in
        Django's HTTP and middleware modules, which a worker process that only
        uses the cache would import for nothing (about 200 ms)."""
        if name == "cache_page":
            from ._cache_page import cache_page

            return cache_page
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


del TYPE_CHECKING  # not a public name

__all__ = ["StampedeCache", "cache_page", "lease_scope"]
