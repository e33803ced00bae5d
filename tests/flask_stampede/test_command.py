"""``flask stampede``: the ``stampede`` command on the app's cache, through
Flask's own command runner."""

from __future__ import annotations

import json

from stampede._protocol.messages import holder
from tests.flask_stampede.app import make_app


def test_flask_stampede_inspects_and_invalidates_the_apps_cache() -> None:
    app, _, _, _ = make_app()
    core = app.extensions["stampede"].core
    core.set("report", {"rows": 3}, ttl=600, tags=["reports"])
    held = core.read("being-rebuilt")
    runner = app.test_cli_runner()
    shown = runner.invoke(args=["stampede", "--help"])
    assert shown.exit_code == 0, shown.output
    assert "Commands: inspect KEY..." in " ".join(shown.output.split())
    done = runner.invoke(args=["stampede", "invalidate-tags", "reports"])
    assert done.exit_code == 0, done.output
    inspected = runner.invoke(args=["stampede", "--json", "inspect", "report", "being-rebuilt"])
    assert inspected.exit_code == 0, inspected.output
    report, rebuilt = json.loads(inspected.output)
    assert (report["status"], report["because"]) == ("stale", "invalidated by tag 'reports'")
    assert (rebuilt["status"], rebuilt["lease"]["state"], rebuilt["lease"]["holder"]) == (
        "missing",
        "held",
        holder(),
    )
    bad = runner.invoke(args=["stampede", "explode"])
    assert bad.exit_code == 2
    core.release(held.lease)
