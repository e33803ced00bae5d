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

from ._cache_page import cache_page as cache_page
from ._leases import lease_scope as lease_scope
from .cache import StampedeCache as StampedeCache

__all__ = ["StampedeCache", "cache_page", "lease_scope"]
