"""The web apps the benchmark serves, each in a server process of its own
(:class:`support.app_servers.AppServer`): the many-waiters scenario's
(:mod:`bench.load._apps.many`) and the sustained-load scenario's (``sustained_django``,
``sustained_flask``).

Every app has ``/ready`` (never cached: the benchmark polls it until the
server answers) and cached pages written the way each framework's
documentation writes cached views.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SOURCE_ROOT"]

#: The directory holding the ``bench`` package: the server processes import the apps from there.
SOURCE_ROOT = Path(__file__).resolve().parents[3]
