"""What the sustained-load apps are told by the process that starts their server: one JSON object
in the environment variable :data:`ENV`, read once per server process."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["ENV", "AppConfig", "Backend", "flag_events", "flag_events_name", "json_from_env"]

#: The environment variable that carries an :class:`AppConfig` as JSON.
ENV = "BENCH_SUSTAINED_APP"

Backend = Literal["stampede", "stock"]


@dataclass(frozen=True)
class AppConfig:
    """How a sustained-load app caches its page, and where it logs its renders."""

    backend: Backend
    redis_url: str
    namespace: str
    #: The pages' timeout (whole seconds fresh: Django's caches round it down), and for stampede
    #: how long a stale page is served.
    ttl: int
    stale_ttl: float
    #: How long one render takes, and the :class:`bench.load._timeline.Timeline` directory.
    render_seconds: float
    timeline: str
    #: For stampede: how long a lease lives unrenewed (``LEASE_TTL``).
    lease_ttl: float = 5.0

    def to_env(self) -> dict[str, str]:
        return {ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls) -> AppConfig:
        return cls(**json_from_env(ENV, "bench.load._sustained"))


def json_from_env(name: str, starter: str) -> dict[str, Any]:
    """The JSON object in the environment variable ``name``, which ``starter``
    (the module that starts the app) sets."""
    try:
        raw = os.environ[name]
    except KeyError:
        raise RuntimeError(f"{name} is not set: this app is started by {starter}") from None
    found: dict[str, Any] = json.loads(raw)
    return found


def flag_events_name(namespace: str) -> str:
    """The Redis hash in which a stampede app counts its flag keys' events, by kind."""
    return f"{namespace}:flag-events"


def flag_events(client: Any, namespace: str) -> dict[str, int]:
    """The flag keys' events so far, by kind (``lease_won``, ``wait_timeout``, ``unfilled``...),
    from ``client`` (a ``redis.Redis``)."""
    return {kind.decode(): int(count) for kind, count in client.hgetall(flag_events_name(namespace)).items()}
