"""The test project as a server process serves it (:class:`support.app_servers.AppServer`):
``asgi`` for an ASGI server, ``wsgi`` for a WSGI one, with the ``CACHES`` and
the ``ROOT_URLCONF`` the environment gives (:func:`environment`).

Django is set up when a server first asks for an app, so that a test can
import this module for :func:`environment` in a process whose Django is
configured otherwise.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import Any

#: The environment variable that carries the settings, as JSON.
ENV = "STAMPEDE_TEST_SITE"


def environment(
    caches: dict[str, Any], *, urls: str = "tests.django_stampede.project.urls"
) -> dict[str, str]:
    """What a server process needs in its environment to serve the project
    with ``caches`` as its ``CACHES`` and ``urls`` as its ``ROOT_URLCONF``."""
    return {ENV: json.dumps({"caches": caches, "urls": urls})}


@functools.cache
def _interfaces() -> dict[str, Callable[..., Any]]:
    from django.conf import settings

    config = json.loads(os.environ[ENV])
    settings.configure(
        SECRET_KEY="only-for-tests",
        USE_TZ=True,
        INSTALLED_APPS=["tests.django_stampede.project"],
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}],
        ROOT_URLCONF=config["urls"],
        MIDDLEWARE=[],
        ALLOWED_HOSTS=["*"],
        CACHES=config["caches"],
        # Tracebacks of failed requests to the log, for the test's failure message.
        LOGGING={
            "version": 1,
            "disable_existing_loggers": False,
            "handlers": {"stderr": {"class": "logging.StreamHandler"}},
            "loggers": {
                "django.request": {"handlers": ["stderr"], "level": "ERROR"},
                "stampede": {"handlers": ["stderr"], "level": "WARNING"},
            },
        },
    )
    from django.core.asgi import get_asgi_application
    from django.core.wsgi import get_wsgi_application

    return {"asgi": get_asgi_application(), "wsgi": get_wsgi_application()}


def __getattr__(name: str) -> Callable[..., Any]:
    if name in ("asgi", "wsgi"):
        return _interfaces()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
