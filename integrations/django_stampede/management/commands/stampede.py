"""``manage.py stampede``: the ``stampede`` command (:mod:`stampede.cli`) on
a cache of ``CACHES``, its keys given as the application gives them (the
cache's ``KEY_PREFIX``, ``VERSION`` and ``KEY_FUNCTION`` applied).

Add ``"django_stampede"`` to ``INSTALLED_APPS``, then::

    python manage.py stampede inspect orders:count
    python manage.py stampede --alias sessions --json stats
"""

from __future__ import annotations

import argparse
import io
from typing import Any

from django.core.cache import caches
from django.core.management.base import BaseCommand, CommandError, CommandParser

import stampede.cli

from ...cache import StampedeCache


class Command(BaseCommand):
    help = (
        "Look inside a stampede cache and invalidate its groups. Commands: inspect KEY... (fresh, "
        "stale or missing and why, times, size, stored form, tags, the lease and its holder); "
        "invalidate-tags TAG...; delete-tags TAG...; invalidate-all; stats (entries, bytes, leases, "
        "tag states, by SCAN). --json prints data instead of text."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--alias", default="default", help="the cache of CACHES (default: default)")
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")
        parser.add_argument("command", nargs=argparse.REMAINDER, help="COMMAND [ARGUMENTS...]")

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["alias"]
        try:
            cache = caches[alias]
        except Exception as exc:  # InvalidCacheBackendError, an unknown alias
            raise CommandError(f"--alias {alias!r}: {exc}") from exc
        if not isinstance(cache, StampedeCache):
            raise CommandError(
                f"--alias {alias!r}: {type(cache).__module__}.{type(cache).__name__} is not "
                "django_stampede.StampedeCache"
            )
        out = io.StringIO()
        try:
            status = stampede.cli.main(
                ["--json", *options["command"]] if options["json"] else options["command"],
                instance=cache.stampede,
                prog="manage.py stampede",
                key_of=cache.make_and_validate_key,
                out=out,
            )
        except SystemExit as exc:  # argparse: a usage error (told on stderr), or --help
            status = exc.code if isinstance(exc.code, int) else 2
            if status == 0:
                return
        self.stdout.write(out.getvalue(), ending="")
        if status:
            raise CommandError(f"stampede {' '.join(options['command'])} failed", returncode=status)
