"""Stampede protection for Flask.

.. code-block:: python

    from flask_stampede import Stampede

    stampede = Stampede(app)  # or Stampede() and stampede.init_app(app)

    @app.get("/report")
    @stampede.cached(ttl=60, stale_ttl=600)
    def report(): ...

and, for code written for Flask-Caching, ``CACHE_TYPE =
"flask_stampede.StampedeCache"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._extension import Stampede as Stampede

if TYPE_CHECKING:
    from ._caching import StampedeCache as StampedeCache

__all__ = ["Stampede", "StampedeCache"]


def __getattr__(name: str) -> Any:
    # Flask-Caching is optional: only its backend needs it.
    if name == "StampedeCache":
        from ._caching import StampedeCache

        return StampedeCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
