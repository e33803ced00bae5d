"""What is stored, and what each request gets back."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask import Flask

import stampede
from tests.flask_stampede.app import make_app
from tests.flask_stampede.test_views import body, expire_all, fetch
from tests.helpers import run_threads, wait_until


def test_only_get_and_head_are_cached(serve: Callable[[Flask], str]) -> None:
    app, _, _, _ = make_app()
    url = serve(app) + "/form"
    assert body(url) == "render 1 GET"
    with urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=30) as posted:
        assert posted.read().decode() == "render 2 POST"
    assert body(url) == "render 1 GET"


def test_conditional_replies_are_not_stored_and_validators_are_honoured(
    serve: Callable[[Flask], str],
) -> None:
    app, _, _, expensive = make_app()
    url = serve(app) + "/conditional"
    with_validator = urllib.request.Request(url, headers={"If-None-Match": '"v1"'})
    with pytest.raises(urllib.error.HTTPError) as first:
        urllib.request.urlopen(with_validator, timeout=30)
    first.value.close()
    assert first.value.code == 304  # rendered for this request, not stored
    assert body(url) == "render 2"  # a new visitor gets the whole page
    assert expensive.runs == 2
    with pytest.raises(urllib.error.HTTPError) as again:
        urllib.request.urlopen(with_validator, timeout=30)
    again.value.close()
    assert again.value.code == 304  # replayed from the cache, made conditional
    assert expensive.runs == 2


def test_send_file_responses_are_stored(serve: Callable[[Flask], str]) -> None:
    app, _, _, expensive = make_app()
    url = serve(app) + "/file"
    assert fetch(url)[:2] == (200, "file body")
    assert fetch(url)[:2] == (200, "file body")
    assert expensive.runs == 1


def test_private_responses_are_not_stored_and_the_views_cache_control_is_kept(
    serve: Callable[[Flask], str],
) -> None:
    app, _, _, expensive = make_app(STAMPEDE_CACHE_CONTROL=True)
    base = serve(app)
    assert body(base + "/private") == "render 1"
    assert body(base + "/private") == "render 2"
    assert fetch(base + "/own-cache-control")[2]["Cache-Control"] == "max-age=5"


def test_background_refresh_sees_the_requests_g(serve: Callable[[Flask], str]) -> None:
    app, ext, _, expensive = make_app()
    url = serve(app) + "/for-user"

    def as_ann() -> str:
        request = urllib.request.Request(url, headers={"X-User": "ann"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return str(response.read().decode())

    assert as_ann() == "render 1 by ann"  # cold: rendered inline
    with app.app_context():
        expire_all(ext.stampede)
    assert as_ann() == "render 1 by ann"  # stale, refreshed in a thread...
    wait_until(lambda: body(url) == "render 2 by ann")  # ...with ann's g


def test_flask_caching_has_misses_while_the_request_holds_the_lease() -> None:
    # memoize(cache_none=True) asks has() after a None from get(): the lease
    # winner's miss must not look like a stored None.
    app, _, cache, expensive = make_app()
    maybe = app.extensions["test"]["maybe"]
    with app.test_request_context():
        assert maybe(1) == 1
        expire_all(cache.cache.stampede)
    with app.test_request_context():
        assert maybe(1) == 2  # the refresh ran; not None
    assert expensive.runs == 2


def test_flask_caching_leases_outside_an_app_context_are_per_thread() -> None:
    app, _, cache, _ = make_app()
    backend = cache.cache
    builds = []

    def cache_aside() -> str:
        value = backend.get("outside")
        if value is None:
            builds.append(1)
            value = "built"
            backend.set("outside", value)
        return str(value)

    assert run_threads(8, cache_aside) == ["built"] * 8
    assert len(builds) == 1


def test_flask_caching_clear_respects_the_key_prefix() -> None:
    pages, _, first, _ = make_app(CACHE_KEY_PREFIX="pages:")
    sessions, _, second, _ = make_app(CACHE_KEY_PREFIX="sessions:")
    namespace = pages.config["CACHE_OPTIONS"]["namespace"]
    second.cache.stampede = first.cache.stampede.__class__(first.cache.stampede.client, namespace=namespace)
    with pages.app_context():
        first.set("a", 1)
    with sessions.app_context():
        second.set("b", 2)
        second.clear()
    with pages.app_context():
        assert first.get("a") == 1


def test_memoize_keys() -> None:
    app, _, _, expensive = make_app()
    functions = app.extensions["test"]
    with app.app_context():
        assert functions["profile"]({"id": 7}) == 1
        assert functions["profile"]({"id": 7, "noise": 1}) == 1  # the key says only the id matters
        assert functions["find"](a=1, b=2) == 2
        assert functions["find"](b=2, a=1) == 2  # keyword order does not matter
    assert expensive.runs == 2


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"STAMPEDE_NAMESPACE": "a{b"}, "STAMPEDE_NAMESPACE is invalid"),
        (
            {"STAMPEDE_REDIS_OPTIONS": {"sockettimeout": 1}},
            r"STAMPEDE_REDIS_OPTIONS\['sockettimeout'\] is not a known option",
        ),
        ({"STAMPEDE_REDIS_OPTIONS": {"decode_responses": True}}, "STAMPEDE_REDIS_OPTIONS is invalid"),
        ({"STAMPEDE_CACHE_HEADER": "X-Cache\r\nEvil: 1"}, "STAMPEDE_CACHE_HEADER must be a header name"),
    ],
)
def test_more_configuration_errors_name_the_setting(config: dict[str, Any], message: str) -> None:
    with pytest.raises(stampede.ConfigurationError, match=message):
        make_app(**config)


def test_responses_refused_for_the_cache_are_rendered_side_by_side(serve: Callable[[Flask], str]) -> None:
    # The first request holds the lease while it renders a 503; when it gives
    # the lease up, the requests that waited render their own at once, side by
    # side, instead of taking the lease from one another in turn.
    app, _, _, expensive = make_app()
    url = serve(app) + "/error"
    expensive.gate.clear()
    try:
        first = ThreadPoolExecutor(1).submit(fetch, url)
        wait_until(lambda: expensive.runs == 1)
        others = ThreadPoolExecutor(5)
        waiting = [others.submit(fetch, url) for _ in range(5)]
        # All five wait for the lease: one through the process's subscriber,
        # four behind it in the process's flight.
        flights = app.extensions["stampede"].core._calls.flights
        wait_until(lambda: _subscribers(app) == 1 and flights.followers() == 4)
    finally:
        expensive.gate.set()
    assert first.result(30)[0] == 503
    assert sorted(future.result(30)[0] for future in waiting) == [503] * 5
    assert expensive.runs == 6
    assert expensive.peak >= 2


def _subscribers(app: Flask) -> int:
    core = app.extensions["stampede"].core
    channels = core.client.pubsub_channels(f"{core.namespace}:*")
    return sum(count for _, count in core.client.pubsub_numsub(*channels)) if channels else 0


def test_a_refresher_whose_response_sets_a_cookie_gets_its_own_response(
    serve: Callable[[Flask], str],
) -> None:
    app, ext, _, _ = make_app()
    url = serve(app) + "/login"
    assert body(url) == "render 1"
    with app.app_context():
        expire_all(ext.stampede)
    request = urllib.request.Request(url, headers={"X-Login": "yes"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.read().decode() == "render 2"  # not the stale page
        assert response.headers["Set-Cookie"].startswith("session=ann")
    # The cookie page was not stored: the entry is still stale, so the next
    # request refreshes it (and that page, cookie-free, is stored).
    assert body(url) == "render 3"
    assert body(url) == "render 3"


def test_no_password_in_the_settings_repr_or_errors(redis_url: str) -> None:
    from flask_caching import Cache
    from flask_stampede import Stampede as FlaskStampede
    from flask_stampede._config import StampedeConfig

    settings = StampedeConfig.from_config(
        {
            "STAMPEDE_REDIS_URL": "redis://:hunter2@127.0.0.1:1/0",
            "STAMPEDE_REDIS_OPTIONS": {"password": "hunter2"},
        }
    )
    assert "hunter2" not in repr(settings)
    for config in (
        {"STAMPEDE_REDIS_URL": "http://:hunter2@h/0"},
        {"CACHE_TYPE": "flask_stampede.StampedeCache", "CACHE_REDIS_URL": "http://:hunter2@h/0"},
    ):
        app = Flask(__name__)
        app.config.update(config)
        with pytest.raises(stampede.ConfigurationError) as raised:
            FlaskStampede(app) if "STAMPEDE_REDIS_URL" in config else Cache(app)
        assert "hunter2" not in str(raised.value)
