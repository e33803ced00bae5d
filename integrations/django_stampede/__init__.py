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
"""

from __future__ import annotations

from .cache import StampedeCache as StampedeCache

__all__ = ["StampedeCache"]
