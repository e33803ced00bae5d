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
"""

from __future__ import annotations

from ._cache_page import cache_page as cache_page
from .cache import StampedeCache as StampedeCache

__all__ = ["StampedeCache", "cache_page"]
