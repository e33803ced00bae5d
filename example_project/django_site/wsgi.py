"""WSGI entry point: ``waitress-serve example_project.django_site.wsgi:application``."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.django_site.settings")

application = get_wsgi_application()

from example_project.django_site.catalog.setup import prepare_database  # noqa: E402  (Django is set up)

prepare_database()
