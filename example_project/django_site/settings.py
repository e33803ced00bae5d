"""Django settings of the example site.

The cache is stampede's backend, or Django's own ``RedisCache`` with
``EXAMPLE_CACHE=stock``: the pages and views are the same either way, which
is the point. See ``example_project/settings.py`` for the variables.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from example_project.settings import load

EXAMPLE = load()

BASE_DIR = Path(__file__).resolve().parent
# A fixed key is fine for a demo that stores no secrets; set one for anything else.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = ["example_project.django_site.catalog", "django_stampede"]  # manage.py stampede
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "example_project.django_site.urls"
WSGI_APPLICATION = "example_project.django_site.wsgi.application"
DATABASES: dict[str, Any] = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": EXAMPLE.database_path}
}
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "OPTIONS": {"builtins": ["django.templatetags.cache"]},
    }
]
USE_TZ = True
TIME_ZONE = "UTC"

if EXAMPLE.cache == "stock":
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": EXAMPLE.redis_url,
            "TIMEOUT": EXAMPLE.ttl,
            "KEY_PREFIX": EXAMPLE.key_prefix,
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": EXAMPLE.redis_url,
            "TIMEOUT": EXAMPLE.ttl,
            "KEY_PREFIX": EXAMPLE.key_prefix,
            # A page past TIMEOUT is served for this much longer while one request re-renders it.
            "OPTIONS": {"STALE_TTL": EXAMPLE.stale_ttl, "WAIT_TIMEOUT": EXAMPLE.wait_timeout},
        }
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"stampede": {"handlers": ["console"], "level": "WARNING"}},
}
