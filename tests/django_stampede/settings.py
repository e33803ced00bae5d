"""Django settings for the tests: Django's cache suite and the test project."""

from __future__ import annotations

import sys
from typing import Any

from django.conf import settings

from . import suite


def configure(redis_url: str) -> None:
    sys.path.insert(0, str(suite.fetch()))  # Django's `cache` test app
    options: dict[str, Any] = {
        "SECRET_KEY": "only-for-tests",
        "USE_TZ": True,
        "DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        "INSTALLED_APPS": [
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "cache",
            "tests.django_stampede.project",
            "django_stampede",  # manage.py stampede
        ],
        "CACHES": {
            "default": {
                "BACKEND": "django_stampede.StampedeCache",
                "LOCATION": redis_url,
            }
        },
        "TEMPLATES": [
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
            }
        ],
        "ROOT_URLCONF": "tests.django_stampede.project.urls",
        "MIDDLEWARE": [],
        "ALLOWED_HOSTS": ["*"],
        "STATIC_URL": "/static/",
    }
    settings.configure(**options)
