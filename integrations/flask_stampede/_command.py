"""``flask stampede``: the ``stampede`` command (:mod:`stampede.cli`) on the
app's cache, registered by :class:`~flask_stampede.Stampede`."""

from __future__ import annotations

import click
from flask.cli import with_appcontext

import stampede.cli

from ._state import state


@click.command(
    "stampede",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    help=(
        "Look inside the app's stampede cache and invalidate its groups. Commands: inspect KEY... "
        "(fresh, stale or missing and why, times, size, stored form, tags, the lease and its holder); "
        "invalidate-tags TAG...; delete-tags TAG...; invalidate-all; stats (entries, bytes, leases, tag "
        "states, by SCAN). --json prints data instead of text."
    ),
)
@click.argument("arguments", nargs=-1, type=click.UNPROCESSED, metavar="[--json] COMMAND [ARGUMENTS]...")
@with_appcontext
def stampede_command(arguments: tuple[str, ...]) -> None:
    status = stampede.cli.main(list(arguments), instance=state().core, prog="flask stampede")
    if status:
        raise click.exceptions.Exit(status)
