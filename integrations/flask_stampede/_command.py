"""``flask stampede``: the ``stampede`` command (:mod:`stampede.cli`) on the
app's cache: the extension's (registered by :class:`~flask_stampede.Stampede`),
else the Flask-Caching backend's (registered by
:class:`~flask_stampede.StampedeCache`), its keys given as the app gives them
to Flask-Caching (``CACHE_KEY_PREFIX`` applied)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from flask import current_app
from flask.cli import with_appcontext

import stampede
import stampede.cli

from ._state import state

__all__ = ["caching_command", "stampede_command"]

_HELP = (
    "Look inside the app's stampede cache and invalidate its groups. Commands: inspect KEY... "
    "(fresh, stale or missing and why, times, size, stored form, tags, the lease and its holder); "
    "invalidate-tags TAG...; delete-tags TAG...; invalidate-all; stats (entries, bytes, leases, tag "
    "states, by SCAN). --json prints data instead of text."
)
_CONTEXT = {"ignore_unknown_options": True, "allow_interspersed_args": False}
_ARGUMENTS = click.argument(
    "arguments", nargs=-1, type=click.UNPROCESSED, metavar="[--json] COMMAND [ARGUMENTS]..."
)


def _run(
    arguments: tuple[str, ...], instance: stampede.Stampede, key_of: Callable[[str], str] | None
) -> None:
    status = stampede.cli.main(list(arguments), instance=instance, prog="flask stampede", key_of=key_of)
    if status:
        raise click.exceptions.Exit(status)


@click.command("stampede", context_settings=_CONTEXT, help=_HELP)
@_ARGUMENTS
@with_appcontext
def stampede_command(arguments: tuple[str, ...]) -> None:
    _run(arguments, state().core, None)


@click.command("stampede", context_settings=_CONTEXT, help=_HELP)
@_ARGUMENTS
@with_appcontext
def caching_command(arguments: tuple[str, ...]) -> None:
    from ._caching import StampedeCache  # Flask-Caching is an extra: imported only here

    backends: list[Any] = [
        backend
        for backend in current_app.extensions.get("cache", {}).values()
        if isinstance(backend, StampedeCache)
    ]
    if len(backends) != 1:
        # Several Flask-Caching caches on stampede: which one is meant is the
        # app's to say; the first would be a guess.
        raise click.UsageError(
            f"the app has {len(backends)} Flask-Caching caches on flask_stampede.StampedeCache: "
            "flask stampede looks into one (use python -m stampede --url ... --namespace ... for others)"
        )
    backend = backends[0]
    _run(arguments, backend.stampede, lambda key: backend.key_prefix + key)
