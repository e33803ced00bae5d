"""The web apps the load benchmarks serve, each in a server process of its own
(:func:`app_server`): the many-waiters benchmark's (:mod:`bench.load._apps.many`), the
sustained-load one's (``sustained_django``, ``sustained_flask``) and the never-written-key one's
(``unwritten_django``, and ``unwritten_worker``, a plain worker process); and the page of the
outage benchmark (:mod:`bench.faults.outage`: ``outage_django``, told by ``outage_config``).

Every app has ``/ready`` (never cached: the benchmark polls it until the
server answers) and cached pages written the way each framework's
documentation writes cached views.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the server processes import this package: they need none of it
    from support.app_servers import AppServer, Server

__all__ = ["SOURCE_ROOT", "app_server"]

#: The directory holding the ``bench`` package: the server processes import the apps from there.
SOURCE_ROOT = Path(__file__).resolve().parents[3]


def app_server(
    app: str, server: Server, *, env: Mapping[str, str], name: str, workdir: str | None = None
) -> AppServer:
    """``app`` (``module:attribute``, a module of this package) served by ``server``, imported from
    the checkout and ready once ``/ready`` answers. With ``workdir``, the server runs in the
    checkout and logs to ``server.log`` there (else to a temporary log)."""
    from support.app_servers import AppServer

    return AppServer(
        f"{__name__}.{app}",
        server,
        env=env,
        pythonpath=[SOURCE_ROOT],
        cwd=None if workdir is None else SOURCE_ROOT,
        log=None if workdir is None else Path(workdir, "server.log"),
        ready_path="/ready",
        name=name,
    )
