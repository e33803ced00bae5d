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
            # the toolbar panel's tests (test_debug_toolbar.py), which add its
            # middleware and URLs to their own requests
            "django.contrib.staticfiles",
            "debug_toolbar",
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
        "DEBUG_TOOLBAR_PANELS": ["django_stampede.debug_toolbar.StampedePanel"],
        "DEBUG_TOOLBAR_CONFIG": {
            "SHOW_TOOLBAR_CALLBACK": "tests.django_stampede.project.toolbar.show_toolbar",
            "IS_RUNNING_TESTS": False,  # the toolbar under test
        },
    }
    settings.configure(**options)
