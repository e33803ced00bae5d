"""WSGI entry point: ``waitress-serve example_project.flask_app.wsgi:app``."""

from __future__ import annotations

from . import create_app

app = create_app()
