"""``flask stampede``: the ``stampede`` command on the app's cache, through
Flask's own command runner."""

from __future__ import annotations

import json
import os

from flask import Flask
from flask_caching import Cache

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


def _caching_app(namespace: str, caches: int = 1) -> tuple[Flask, list[Cache]]:
    """An app with Flask-Caching on stampede's backend only (no extension)."""
    app = Flask(__name__)
    app.config.update(
        CACHE_TYPE="flask_stampede.StampedeCache",
        CACHE_REDIS_URL=os.environ["STAMPEDE_TEST_REDIS_URL"],
        CACHE_KEY_PREFIX="site:",
        CACHE_OPTIONS={"namespace": namespace},
    )
    return app, [Cache(app) for _ in range(caches)]


def test_flask_stampede_looks_into_a_flask_caching_backend_with_the_apps_keys() -> None:
    app, (cache,) = _caching_app("flask-caching-command")
    with app.app_context():
        cache.set("report", {"rows": 3}, timeout=600)
    runner = app.test_cli_runner()
    assert runner.invoke(args=["stampede", "--help"]).exit_code == 0
    # The key as the app gives it to Flask-Caching: CACHE_KEY_PREFIX is applied.
    inspected = runner.invoke(args=["stampede", "--json", "inspect", "report", "absent"])
    assert inspected.exit_code == 0, inspected.output
    report, absent = json.loads(inspected.output)
    assert report["status"] == "fresh"
    assert absent["status"] == "missing"
    deleted = runner.invoke(args=["stampede", "invalidate-all"])
    assert deleted.exit_code == 0, deleted.output
    again = json.loads(runner.invoke(args=["stampede", "--json", "inspect", "report"]).output)
    assert again[0]["status"] == "stale"


def test_flask_stampede_refuses_to_guess_among_several_flask_caching_backends() -> None:
    app, _ = _caching_app("flask-caching-command-two", caches=2)
    refused = app.test_cli_runner().invoke(args=["stampede", "stats"])
    assert refused.exit_code == 2
    assert "2 Flask-Caching caches" in refused.output
