"""``django_stampede.cache_page``: Django's ``cache_page``, with the cache
awaited for async views.

In process, with Django's ``AsyncClient``: the same decisions, keys, timeouts
and headers as Django's own decorator, scenario by scenario, on any backend.
Under a real ASGI server: ``test_cache_page_under_uvicorn``.
"""

from __future__ import annotations

import itertools
import os
import types
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import django_stampede
import pytest
from asgiref.sync import iscoroutinefunction
from django.core.cache import cache, caches
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template import engines
from django.template.response import SimpleTemplateResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.cache import cache_page as django_cache_page

from tests.django_stampede import recording
from tests.django_stampede.project import views

URL = os.environ.get("STAMPEDE_TEST_REDIS_URL", "")
_namespaces = itertools.count()


def namespace() -> str:
    return f"cachepage{os.getpid()}-{next(_namespaces)}"


def stale_serving() -> dict[str, Any]:
    """As test_views' cache: stale pages served for 30 s after expiry, leases
    freed by their request only, a namespace of the test's own."""
    return {
        "BACKEND": "django_stampede.StampedeCache",
        "LOCATION": URL,
        "OPTIONS": {"STALE_TTL": 30, "LEASE_TTL": 60, "NAMESPACE": namespace()},
    }


# --- a sync view --------------------------------------------------------------------


@pytest.fixture
def stampede_cache() -> Iterator[None]:
    with override_settings(CACHES={"default": stale_serving()}):
        views.renders.reset()
        yield
        cache.clear()


@pytest.mark.usefixtures("stampede_cache")
def test_a_sync_view_is_cached_as_by_djangos_cache_page() -> None:
    client = Client()
    first = client.get("/sync-page/")
    assert first.content == b"render 1"
    assert first.has_header("Expires")
    assert first["Cache-Control"] == "max-age=60"
    second = client.get("/sync-page/")
    assert second.content == b"render 1"
    assert second.has_header("Age")  # Django's mark of a page served from its cache
    assert views.renders.value == 1


def test_the_decorated_views_keep_their_kind() -> None:
    assert iscoroutinefunction(views.async_page)
    assert not iscoroutinefunction(views.sync_page)
    assert views.async_page.__name__ == "async_page"


# --- the same as Django's, scenario by scenario ----------------------------------------

Respond = Callable[[HttpRequest, int], Any]


def page(status: int = 200, **headers: str) -> Respond:
    def respond(request: HttpRequest, n: int) -> HttpResponse:
        response = HttpResponse(f"render {n}", status=status)
        for name, value in headers.items():
            response[name.replace("_", "-")] = value
        return response

    return respond


def with_cookie(*, vary: bool) -> Respond:
    def respond(request: HttpRequest, n: int) -> HttpResponse:
        response = (page(Vary="Cookie") if vary else page())(request, n)
        response.set_cookie("session", "yours")
        return response

    return respond


def streamed(request: HttpRequest, n: int) -> StreamingHttpResponse:
    async def chunks() -> AsyncIterator[bytes]:
        yield f"render {n}".encode()

    return StreamingHttpResponse(chunks())


def template(request: HttpRequest, n: int) -> SimpleTemplateResponse:
    return SimpleTemplateResponse(engines["django"].from_string("render {{ n }}"), {"n": n})


@dataclass(frozen=True)
class Scenario:
    requests: list[tuple[str, str, dict[str, str]]]  # method, path, headers
    respond: Respond
    renders: int  # expected: fewer than requests where pages came from the cache
    timeout: float | None = 30
    key_prefix: str | None = None
    cache: str | None = None


def GET(path: str = "/page/", **headers: str) -> tuple[str, str, dict[str, str]]:
    return ("GET", path, headers)


def HEAD(path: str = "/page/", **headers: str) -> tuple[str, str, dict[str, str]]:
    return ("HEAD", path, headers)


def POST(path: str = "/page/") -> tuple[str, str, dict[str, str]]:
    return ("POST", path, {})


SCENARIOS = {
    "get twice": Scenario([GET(), GET()], page(), renders=1),
    "query strings": Scenario([GET("/page/?a=1"), GET("/page/?a=2"), GET("/page/?a=1")], page(), renders=2),
    "post": Scenario([POST(), POST(), GET(), GET()], page(), renders=3),
    "head served from the get page": Scenario([GET(), HEAD()], page(), renders=1),
    "head first": Scenario([HEAD(), HEAD(), GET(), HEAD()], page(), renders=2),
    "status 404": Scenario([GET(), GET()], page(404), renders=2),
    "status 304": Scenario([GET(), GET()], page(304), renders=2),
    "private": Scenario([GET(), GET()], page(Cache_Control="private"), renders=2),
    "no-cache": Scenario([GET(), GET()], page(Cache_Control="no-cache"), renders=2),
    "no-store": Scenario([GET(), GET()], page(Cache_Control="no-store"), renders=2),
    "cookie, vary cookie": Scenario([GET(), GET()], with_cookie(vary=True), renders=2),
    "cookie, no vary": Scenario([GET(), GET()], with_cookie(vary=False), renders=1),
    "vary cookie, no cookie": Scenario([GET(), GET()], page(Vary="Cookie"), renders=1),
    "vary *": Scenario([GET(), GET()], page(Vary="*"), renders=2),
    "vary accept": Scenario(
        [GET(Accept="text/html"), GET(Accept="text/plain"), GET(Accept="text/html")],
        page(Vary="Accept"),
        renders=2,
    ),
    "vary accept, absent then empty": Scenario(
        [GET(), GET(Accept=""), GET()], page(Vary="Accept"), renders=2
    ),
    "vary accept-language, in the key already": Scenario(
        [GET(Accept_Language="fr"), GET(Accept_Language="de")], page(Vary="Accept-Language"), renders=1
    ),
    "authorization": Scenario(
        [GET(Authorization="Bearer a"), GET(Authorization="Bearer b"), GET(Authorization="Bearer a")],
        page(),
        renders=2,
    ),
    "authorization, public page": Scenario(
        [GET(Authorization="Bearer a"), GET(Authorization="Bearer b")],
        page(Cache_Control="public"),
        renders=1,
    ),
    "max-age, decorator's timeout wins": Scenario([GET(), GET()], page(Cache_Control="max-age=5"), renders=1),
    "max-age=0, decorator's timeout wins": Scenario(
        [GET(), GET()], page(Cache_Control="max-age=0"), renders=1
    ),
    "max-age, no timeout": Scenario([GET(), GET()], page(Cache_Control="max-age=5"), renders=1, timeout=None),
    "max-age=0, no timeout": Scenario(
        [GET(), GET()], page(Cache_Control="max-age=0"), renders=2, timeout=None
    ),
    "no max-age, no timeout": Scenario([GET(), GET()], page(), renders=1, timeout=None),
    "timeout 0": Scenario([GET(), GET()], page(), renders=2, timeout=0),
    "key prefix": Scenario([GET(), GET()], page(), renders=1, key_prefix="site1"),
    "other cache": Scenario([GET(), GET()], page(), renders=1, cache="other"),
    "streaming": Scenario([GET(), GET()], streamed, renders=2),
    "template response": Scenario([GET(), GET()], template, renders=1),
}


@dataclass
class Outcome:
    renders: int = 0
    replies: list[tuple[Any, ...]] = field(default_factory=list)
    calls: list[recording.Call] = field(default_factory=list)

    def io(self) -> list[tuple[str, str, str, Any]]:
        """The cache calls, sync and async alike: (cache, read or write, key, timeout)."""
        return [(c.cache, c.method.removeprefix("a"), c.key, c.timeout) for c in self.calls]

    def writes(self) -> list[tuple[str, Any]]:
        return [(key, timeout) for _, method, key, timeout in self.io() if method == "set"]


@pytest.fixture(params=["locmem", "stampede"])
def recording_caches(request: pytest.FixtureRequest) -> Iterator[None]:
    """Two aliases, ``default`` and ``other``, recording the calls made to them."""
    if request.param == "locmem":
        backend, location, options = "RecordingLocMemCache", "", {}
    else:
        # A wait here would be a lease left behind: fail at once rather than wait it out.
        backend, location, options = (
            "RecordingStampedeCache",
            URL,
            {"WAIT_TIMEOUT": 5, "ON_WAIT_TIMEOUT": "raise"},
        )
    config = {
        alias: {
            "BACKEND": f"tests.django_stampede.recording.{backend}",
            "LOCATION": location or alias,
            "KEY_PREFIX": alias,
            "OPTIONS": {**options, "NAMESPACE": namespace()} if options else {},
        }
        for alias in ("default", "other")
    }
    with override_settings(CACHES=config):
        yield
        for alias in config:
            caches[alias].clear()


async def run(decorator: Callable[..., Any], kind: str, scenario: Scenario) -> Outcome:
    """Serve ``scenario``'s requests, one after the other, through a view of
    ``kind`` (sync or async) decorated by ``decorator`` on an emptied cache."""
    outcome = Outcome()

    def respond(request: HttpRequest) -> Any:
        outcome.renders += 1
        return scenario.respond(request, outcome.renders)

    async def async_view(request: HttpRequest) -> Any:
        return respond(request)

    view = async_view if kind == "async" else respond
    urls = types.ModuleType("urls")
    urls.urlpatterns = [  # type: ignore[attr-defined]
        path("page/", decorator(scenario.timeout, cache=scenario.cache, key_prefix=scenario.key_prefix)(view))
    ]
    for alias in ("default", "other"):
        await caches[alias].aclear()
    recording.calls.clear()
    with override_settings(ROOT_URLCONF=urls):
        for method, url, headers in scenario.requests:
            response = await AsyncClient().generic(method, url, headers=headers)
            if response.streaming:
                body = b"".join([chunk async for chunk in response.streaming_content])
            else:
                body = response.content
            outcome.replies.append(
                (
                    response.status_code,
                    body,
                    response.get("Cache-Control"),
                    response.get("Vary"),
                    response.has_header("Expires"),
                    response.has_header("Age"),  # set on pages served from the cache
                    sorted(response.cookies),
                )
            )
    outcome.calls = list(recording.calls)
    return outcome


@pytest.mark.usefixtures("recording_caches")
@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("name", SCENARIOS)
async def test_same_pages_keys_and_timeouts_as_djangos_cache_page(name: str, kind: str) -> None:
    scenario = SCENARIOS[name]
    django = await run(django_cache_page, kind, scenario)
    ours = await run(django_stampede.cache_page, kind, scenario)
    assert django.renders == scenario.renders  # the scenario says what Django does
    assert ours.renders == scenario.renders
    assert ours.replies == django.replies
    assert ours.io() == django.io()
    # Never the cache's blocking API on the event loop's thread (template
    # responses are stored where they are rendered, in a worker thread).
    assert not [call for call in ours.calls if call.on_loop]


@pytest.mark.usefixtures("recording_caches")
async def test_djangos_own_cache_page_calls_the_blocking_api_on_the_event_loop() -> None:
    # Why this decorator exists; if Django stops doing this, it may go.
    django = await run(django_cache_page, "async", SCENARIOS["get twice"])
    assert [call.method for call in django.calls if call.on_loop] == ["get", "set", "set", "get", "get"]
    ours = await run(django_stampede.cache_page, "async", SCENARIOS["get twice"])
    assert [call.method for call in ours.calls] == ["aget", "aset", "aset", "aget", "aget"]


@pytest.mark.usefixtures("recording_caches")
@pytest.mark.parametrize(
    ("name", "timeout"),
    [
        ("get twice", 30),
        ("max-age, decorator's timeout wins", 30),
        ("max-age=0, decorator's timeout wins", 30),
        ("max-age, no timeout", 5),
        ("no max-age, no timeout", 600),  # CACHE_MIDDLEWARE_SECONDS
    ],
)
async def test_the_page_is_stored_for_the_timeout_django_would_give_it(name: str, timeout: int) -> None:
    ours = await run(django_stampede.cache_page, "async", SCENARIOS[name])
    assert [stored for _, stored in ours.writes()] == [timeout, timeout]  # the header list, then the page


@pytest.mark.usefixtures("recording_caches")
async def test_key_prefix_and_cache_alias_are_honoured() -> None:
    prefixed = await run(django_stampede.cache_page, "async", SCENARIOS["key prefix"])
    assert prefixed.calls
    assert all(".site1." in call.key and call.cache == "default" for call in prefixed.calls)
    other = await run(django_stampede.cache_page, "async", SCENARIOS["other cache"])
    assert other.calls
    assert {call.cache for call in other.calls} == {"other"}


@pytest.mark.usefixtures("recording_caches")
async def test_an_authorized_page_varies_on_authorization() -> None:
    ours = await run(django_stampede.cache_page, "async", SCENARIOS["authorization"])
    assert [reply[3] for reply in ours.replies] == ["Authorization"] * 3
    assert [reply[1] for reply in ours.replies] == [b"render 1", b"render 2", b"render 1"]


@pytest.mark.usefixtures("recording_caches")
@pytest.mark.parametrize("decorator", [django_cache_page, django_stampede.cache_page])
async def test_a_view_that_raises_stores_nothing_and_blocks_nobody(decorator: Callable[..., Any]) -> None:
    calls = 0

    @decorator(30)
    async def view(request: HttpRequest) -> HttpResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the view failed")
        return HttpResponse("rendered")

    urls = types.ModuleType("urls")
    urls.urlpatterns = [path("page/", view)]  # type: ignore[attr-defined]
    recording.calls.clear()
    with override_settings(ROOT_URLCONF=urls):
        with pytest.raises(RuntimeError, match="the view failed"):
            await AsyncClient().get("/page/")
        assert [call for call in recording.calls if call.method.endswith("set")] == []
        assert (await AsyncClient().get("/page/")).content == b"rendered"  # no wait for the failed request
    assert calls == 2


@pytest.mark.usefixtures("recording_caches")
async def test_an_async_class_based_view_through_method_decorator() -> None:
    renders = 0

    @method_decorator(django_stampede.cache_page(30), name="get")
    class Page(View):
        async def get(self, request: HttpRequest) -> HttpResponse:
            nonlocal renders
            renders += 1
            return HttpResponse(f"render {renders}")

    urls = types.ModuleType("urls")
    urls.urlpatterns = [path("page/", Page.as_view())]  # type: ignore[attr-defined]
    recording.calls.clear()
    with override_settings(ROOT_URLCONF=urls):
        replies = [(await AsyncClient().get("/page/")).content for _ in range(2)]
    assert replies == [b"render 1", b"render 1"]
    assert [call.method for call in recording.calls] == ["aget", "aset", "aset", "aget", "aget"]
