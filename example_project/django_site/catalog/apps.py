"""The catalog app: its receivers connect when Django is ready."""

from __future__ import annotations

from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "example_project.django_site.catalog"
    label = "catalog"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import receivers  # noqa: F401  (connects them)
