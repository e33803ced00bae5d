"""What the sustained-load apps are told by the process that starts their server: one JSON object
in the environment variable :data:`ENV`, read once per server process."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["ENV", "AppConfig", "Backend"]

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
    #: How long one render takes, and the :class:`bench._timeline.Timeline` directory.
    render_seconds: float
    timeline: str

    def to_env(self) -> dict[str, str]:
        return {ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls) -> AppConfig:
        try:
            raw = os.environ[ENV]
        except KeyError:
            raise RuntimeError(f"{ENV} is not set: this app is started by bench._sustained") from None
        return cls(**json.loads(raw))
