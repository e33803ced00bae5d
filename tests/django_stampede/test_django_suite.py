"""Django's own cache backend tests (``BaseCacheTests``), run against
``django_stampede.StampedeCache``: the definition of a drop-in."""

from __future__ import annotations

import os

from cache.tests import BaseCacheTests, caches_setting_for_tests  # type: ignore[import-not-found]
from django.test import TestCase, override_settings

BACKEND = {"BACKEND": "django_stampede.StampedeCache", "LOCATION": os.environ["STAMPEDE_TEST_REDIS_URL"]}


@override_settings(CACHES=caches_setting_for_tests(base=BACKEND, exclude={"cull", "zero_cull"}))
class StampedeCacheTests(BaseCacheTests, TestCase):  # type: ignore[misc]
    """Every test Django's own backends pass, on this one."""
