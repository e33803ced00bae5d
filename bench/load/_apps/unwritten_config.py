"""What the never-written-key apps (``unwritten_django``, ``unwritten_worker``) are told by the
process that starts them: one JSON object in the environment variable :data:`ENV`, read once per
process; and the Django settings both build from it, so the web app and the plain worker
processes have the very same ``CACHES``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from .django_site import LOGGING
from .sustained_config import Backend, json_from_env

__all__ = ["ENV", "FLAG", "WORKER_FLAG", "AppConfig", "settings"]

#: The environment variable that carries an :class:`AppConfig` as JSON.
ENV = "BENCH_UNWRITTEN_APP"

#: The key the views read and nobody ever writes.
FLAG = "maintenance_mode"
#: The key the worker processes read and nobody ever writes.
WORKER_FLAG = "feature:beta-banner"


@dataclass(frozen=True)
class AppConfig:
    """Which cache the app uses, and how long its simulated work takes."""

    backend: Backend
    redis_url: str
    #: ``CACHES["default"]["TIMEOUT"]``.
    timeout: int
    #: The slow page's ``cache_page`` timeout, and how long its render takes.
    page_timeout: int
    render_seconds: float
    #: The views' simulated work after the cache read.
    work_seconds: float
    #: The :class:`bench.load._timeline.Timeline` directory of the slow page's renders.
    timeline: str

    def to_env(self) -> dict[str, str]:
        return {ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls) -> AppConfig:
        return cls(**json_from_env(ENV, "bench.load.unwritten"))

    def cache(self) -> dict[str, Any]:
        """``CACHES["default"]``: the stock backend or stampede's, on their defaults."""
        if self.backend == "stampede":
            return {
                "BACKEND": "django_stampede.StampedeCache",
                "LOCATION": self.redis_url,
                "TIMEOUT": self.timeout,
            }
        return {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": self.redis_url,
            "TIMEOUT": self.timeout,
        }


def settings(config: AppConfig, **more: Any) -> dict[str, Any]:
    """Django's settings for ``config``: ``settings.configure(**settings(config))``."""
    return {
        "DEBUG": False,
        "SECRET_KEY": "bench-unwritten-not-secret",  # StampedeCache signs its values with it
        "ALLOWED_HOSTS": ["127.0.0.1", "localhost"],
        "INSTALLED_APPS": [],
        "MIDDLEWARE": [],
        "DATABASES": {},
        "USE_TZ": True,
        "CACHES": {"default": config.cache()},
        "LOGGING": LOGGING,
        **more,
    }
