"""The debug toolbar panel, through Django's test client and the toolbar's own
views, against the suite's redis-server: each cache call of a request listed
with its cache, key and outcome, a wait with its duration, a fail-open, and
the leases the request held and what became of each."""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from typing import Any

import pytest
from django.core.cache import cache, caches
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client, override_settings
from django_stampede import StampedeCache
from django_stampede._recording import METHODS

from stampede import Event, EventKind
from tests.django_stampede.project import toolbar

URL = os.environ.get("STAMPEDE_TEST_REDIS_URL", "")
_namespaces = itertools.count()

#: Set when a request finds the lease on ``report`` taken: it waits from then on.
busy = threading.Event()


def on_event(event: Event) -> None:
    if event.kind is EventKind.LEASE_BUSY and event.key.endswith("report"):
        busy.set()


def recorded_cache(**options: Any) -> dict[str, Any]:
    return {
        "BACKEND": "django_stampede.StampedeCache",
        "LOCATION": URL,
        "OPTIONS": {
            "RECORD_CALLS": True,
            "LEASE_TTL": 60,  # only a request's end or write frees a lease here
            "NAMESPACE": f"toolbar{os.getpid()}-{next(_namespaces)}",
            **options,
        },
    }


@pytest.fixture(autouse=True)
def toolbar_site() -> Iterator[None]:
    closed = socket.socket()  # bound, never listening: connections to it are refused
    closed.bind(("127.0.0.1", 0))
    away = f"redis://127.0.0.1:{closed.getsockname()[1]}/0"
    settings = {
        "CACHES": {
            "default": recorded_cache(STALE_TTL=30, ON_EVENT=on_event),
            "away": {
                "BACKEND": "django_stampede.StampedeCache",
                "LOCATION": away,
                "OPTIONS": {"RECORD_CALLS": True, "FAIL_OPEN": True, "socket_connect_timeout": 1},
            },
            "silent": {"BACKEND": "django_stampede.StampedeCache", "LOCATION": URL},
        },
        "MIDDLEWARE": ["debug_toolbar.middleware.DebugToolbarMiddleware"],
        "ROOT_URLCONF": "tests.django_stampede.project.toolbar",
    }
    toolbar.gate.set()
    toolbar.entered.clear()
    busy.clear()
    try:
        with override_settings(**settings):
            yield
            cache.clear()
    finally:
        toolbar.gate.set()
        closed.close()


# --- reading the panel as a browser gets it ------------------------------------------


class _Tables(HTMLParser):
    """The rows of each table of a page, as the texts of their cells."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.paragraphs: list[str] = []
        self._cell: list[str] | None = None
        self._paragraph: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "p":
            self._paragraph = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "p" and self._paragraph is not None:
            self.paragraphs.append(" ".join("".join(self._paragraph).split()))
            self._paragraph = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._paragraph is not None:
            self._paragraph.append(data)


class Panel:
    """The panel of one request, as the toolbar's own view renders it."""

    def __init__(self, content: str) -> None:
        parsed = _Tables()
        parsed.feed(content)
        self.text = content
        self.paragraphs = parsed.paragraphs
        tables = {tuple(table[0]): [row for row in table[1:]] for table in parsed.tables}
        self.calls = [dict(zip(_CALL_COLUMNS, row, strict=True)) for row in tables.get(_CALL_COLUMNS, [])]
        self.leases = [dict(zip(_LEASE_COLUMNS, row, strict=True)) for row in tables.get(_LEASE_COLUMNS, [])]

    def outcomes(self) -> list[tuple[str, str, str, str]]:
        """Each call's cache, method, key and outcome, in order."""
        return [(call["Cache"], call["Method"], call["Key"], call["Outcome"]) for call in self.calls]


_CALL_COLUMNS = ("#", "Cache", "Method", "Key", "Outcome", "Time")
_LEASE_COLUMNS = ("Cache", "Key", "Won by", "What became of it")


def lease(*cells: str) -> dict[str, str]:
    """A row of the panel's table of leases."""
    return dict(zip(_LEASE_COLUMNS, cells, strict=True))


def panel_of(response: Any) -> Panel:
    """The panel of the request ``response`` answered, fetched as the
    toolbar's script fetches it when the panel is opened."""
    found = re.search(r'data-request-id="([0-9a-f]+)"', response.content.decode())
    assert found, "no toolbar in the page"
    rendered = Client().get(
        "/__debug__/render_panel/", {"request_id": found.group(1), "panel_id": "StampedePanel"}
    )
    assert rendered.status_code == 200
    return Panel(rendered.json()["content"])


def nav_subtitle(response: Any) -> str:
    """The panel's line in the toolbar's side bar."""
    page = response.content.decode()
    found = re.search(r'id="djdt-StampedePanel".*?<small>\s*(.*?)\s*</small>', page, re.S)
    assert found, "no StampedePanel in the toolbar"
    return " ".join(found.group(1).split())


# --- the calls --------------------------------------------------------------------


def test_each_call_of_a_request_is_listed_with_its_cache_key_and_outcome() -> None:
    response = Client().get("/calls/")
    assert response.status_code == 200
    panel = panel_of(response)
    outcomes = panel.outcomes()
    assert outcomes[0] == ("default", "get", "greeting", "miss, lease won")
    assert outcomes[1][:3] == ("default", "set", "greeting")
    assert re.fullmatch(r"rebuilt in \d+\.\d ms, stored", outcomes[1][3])
    assert outcomes[2] == ("default", "get", "greeting", "fresh hit")
    assert outcomes[3][:3] == ("default", "get_or_set", "answer")
    assert re.fullmatch(r"miss, lease won, rebuilt in \d+\.\d ms", outcomes[3][3])
    assert outcomes[4] == ("default", "get", "never-written", "miss, lease won")
    assert len(outcomes) == 5
    assert [call["#"] for call in panel.calls] == ["1", "2", "3", "4", "5"]
    assert all(re.fullmatch(r"\d+\.\d\d ms", call["Time"]) for call in panel.calls)


def test_the_leases_the_request_held_and_what_became_of_each() -> None:
    panel = panel_of(Client().get("/calls/"))
    assert panel.leases == [
        lease("default", "greeting", "get #1", "committed by set #2"),
        lease("default", "answer", "get_or_set #4", "committed within get_or_set #4"),
        lease(
            "default",
            "never-written",
            "get #5",
            "held at the response: given back when the request ends (nothing stored it)",
        ),
    ]


def test_the_side_bar_counts_the_calls() -> None:
    response = Client().get("/calls/")
    assert re.fullmatch(r"5 calls in \d+\.\d\d ms: 1 hit, 3 misses", nav_subtitle(response))


def test_a_request_that_waited_for_another_ones_rebuild_shows_the_wait_and_its_duration() -> None:
    toolbar.gate.clear()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(Client().get, "/rebuild/")
        assert toolbar.entered.wait(30), "the first request never started its rebuild"
        second = pool.submit(Client().get, "/rebuild/")
        assert busy.wait(30), "the second request never found the lease taken"
        toolbar.gate.set()
        rebuilt, waited = first.result(30), second.result(30)
    assert b"built" in rebuilt.content
    assert b"built" in waited.content
    rebuilder = panel_of(rebuilt)
    assert rebuilder.outcomes()[0] == ("default", "get", "report", "miss, lease won")
    assert rebuilder.outcomes()[1][1:3] == ("set", "report")
    assert rebuilder.leases == [lease("default", "report", "get #1", "committed by set #2")]
    follower = panel_of(waited)
    [(alias, method, key, outcome)] = follower.outcomes()
    assert (alias, method, key) == ("default", "get", "report")
    assert re.fullmatch(r"miss, lease busy, waited \d+\.\d ms", outcome)
    assert follower.calls[0]["Outcome"] == outcome
    assert follower.leases == []
    assert nav_subtitle(waited).endswith(": 1 wait")


def test_a_request_served_stale_while_another_refreshes_shows_the_stale_hit() -> None:
    cache.set("report", "old")
    cache.invalidate("report")
    toolbar.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        refreshing = pool.submit(Client().get, "/rebuild/")
        assert toolbar.entered.wait(30), "no request refreshed the stale report"
        served = Client().get("/rebuild/")
        toolbar.gate.set()
        refreshed = refreshing.result(30)
    assert b"old" in served.content
    assert panel_of(served).outcomes() == [("default", "get", "report", "stale hit")]
    assert nav_subtitle(served).endswith(": 1 stale")
    refresher = panel_of(refreshed)
    assert refresher.outcomes()[0] == ("default", "get", "report", "stale, lease won")
    assert refresher.leases == [lease("default", "report", "get #1", "committed by set #2")]


def test_a_cache_whose_redis_is_away_shows_fail_open() -> None:
    response = Client().get("/away/")
    assert b"rendered without Redis" in response.content
    panel = panel_of(response)
    (alias, method, key, read), written = panel.outcomes()
    assert (alias, method, key) == ("away", "get", "profile")
    # Redis's error itself is not always seen: once Redis is known to be
    # away, calls skip it for a while.
    assert read.endswith("fail-open, not found")
    assert written == (
        "away",
        "set",
        "profile",
        "stored nowhere: Redis away (served to this process's callers)",
    )
    assert panel.leases == [
        lease(
            "away",
            "profile",
            "get #1 (this process alone: Redis away)",
            "set #2 served it to this process's callers: stored nowhere (Redis away)",
        )
    ]
    assert "fail-open" in nav_subtitle(response)


async def test_an_async_views_calls_are_listed() -> None:
    client = AsyncClient()
    response = await client.get("/async-calls/")
    assert response.status_code == 200
    found = re.search(r'data-request-id="([0-9a-f]+)"', response.content.decode())
    assert found
    rendered = await client.get(
        "/__debug__/render_panel/", {"request_id": found.group(1), "panel_id": "StampedePanel"}
    )
    panel = Panel(rendered.json()["content"])
    outcomes = panel.outcomes()
    assert outcomes[0] == ("default", "aget", "greeting", "miss, lease won")
    assert outcomes[1][1:3] == ("aset", "greeting")
    assert outcomes[2] == ("default", "aget", "greeting", "fresh hit")
    assert panel.leases == [lease("default", "greeting", "aget #1", "committed by aset #2")]


def test_the_panel_names_the_caches_that_do_not_record() -> None:
    panel = panel_of(Client().get("/calls/"))
    assert (
        'CACHES["silent"] does not record its calls: set its OPTIONS["RECORD_CALLS"] = True to see them here.'
        in panel.paragraphs
    )


def test_keys_are_shown_escaped() -> None:
    panel = panel_of(Client().get("/escaped/", {"key": "<script>alert(1)</script>"}))
    assert panel.outcomes()[0][2] == "<script>alert(1)</script>"  # as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in panel.text
    assert "<script>alert" not in panel.text


# --- the cost when nothing records ------------------------------------------------


def test_a_cache_that_does_not_record_is_not_touched() -> None:
    silent = caches["silent"]
    assert not set(METHODS) & set(vars(silent))  # its methods are its class's
    assert silent._config.on_event is None  # its core builds no event for a hit
    recorded = caches["default"]
    assert set(METHODS) <= set(vars(recorded))


def test_every_method_that_reads_or_writes_is_recorded() -> None:
    not_calls = {"close", "aclose", "make_key", "validate_key", "make_and_validate_key"}
    not_calls |= {"get_backend_timeout", "stampede", "astampede"}
    public = {
        name
        for name in dir(StampedeCache)
        if not name.startswith("_") and callable(getattr(StampedeCache, name, None))
    }
    assert public - not_calls == set(METHODS)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yes", r"OPTIONS\['RECORD_CALLS'\] must be True or False, got 'yes'"),
        (1, r"OPTIONS\['RECORD_CALLS'\] must be True or False, got 1"),
    ],
)
def test_a_bad_record_calls_setting_names_it(value: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        StampedeCache(URL, {"OPTIONS": {"RECORD_CALLS": value}})


def test_a_misspelt_record_calls_is_caught() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"Did you mean OPTIONS\['RECORD_CALLS'\]\?"):
        StampedeCache(URL, {"OPTIONS": {"RECORD_CALL": True}})
