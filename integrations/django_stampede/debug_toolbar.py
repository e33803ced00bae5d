"""A django-debug-toolbar panel: each cache call of the request, in order,
with its cache, method, key, outcome (fresh hit, stale hit, miss, lease won,
waited and for how long, fail-open...) and time taken; and the leases the
request won and what became of each.

.. code-block:: python

    DEBUG_TOOLBAR_PANELS = [
        ...,  # the toolbar's panels you use
        "django_stampede.debug_toolbar.StampedePanel",
    ]
    CACHES["default"]["OPTIONS"]["RECORD_CALLS"] = True  # each cache to show

Only this module imports ``debug_toolbar``: the backend never needs it.
"""

from __future__ import annotations

import functools
from contextlib import ExitStack
from typing import Any

from debug_toolbar.panels import Panel
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.template import Context, Engine, Template
from django.utils.module_loading import import_string

from ._outcomes import as_dicts, call_rows, lease_rows
from ._recording import Recorder, recording
from .cache import StampedeCache

__all__ = ["StampedePanel"]

#: The counts of the summary, in order, by a call's kind: what each counts as.
_COUNTED = {
    "hit": "hit",
    "stale": "stale",
    "miss": "miss",
    "lease": "miss",
    "wait": "wait",
    "fail-open": "fail-open",
    "error": "error",
}
_ORDER = ("hit", "stale", "miss", "wait", "fail-open", "error")
_PLURALS = {"hit": "hits", "miss": "misses", "wait": "waits", "error": "errors"}

_TEMPLATE = """
<p>{{ summary }}</p>
{% for alias in silent %}
  <p><code>CACHES["{{ alias }}"]</code> does not record its calls: set its
  <code>OPTIONS["RECORD_CALLS"] = True</code> to see them here.</p>
{% endfor %}
<h4>Calls</h4>
{% if calls %}
  <table>
    <thead>
      <tr>
        <th>#</th><th>Cache</th><th>Method</th><th>Key</th><th>Outcome</th><th>Time</th>
      </tr>
    </thead>
    <tbody>
      {% for call in calls %}
        <tr class="{% if call.kind in highlighted %}djdt-highlighted{% endif %}">
          <td>{{ call.number }}</td>
          <td>{{ call.alias }}</td>
          <td>{% if call.depth %}&#8627; {% endif %}{{ call.method }}</td>
          <td><code>{{ call.key }}</code></td>
          <td>{{ call.outcome }}</td>
          <td>{{ call.ms|floatformat:2 }} ms</td>
        </tr>
      {% endfor %}
    </tbody>
  </table>
{% else %}
  <p>No call of a cache that records its calls.</p>
{% endif %}
<h4>Leases</h4>
{% if leases %}
  <table>
    <thead>
      <tr><th>Cache</th><th>Key</th><th>Won by</th><th>What became of it</th></tr>
    </thead>
    <tbody>
      {% for lease in leases %}
        <tr>
          <td>{{ lease.alias }}</td>
          <td><code>{{ lease.key }}</code></td>
          <td>{{ lease.won_by }}{% if lease.without_redis %} (this process alone: Redis away){% endif %}</td>
          <td>{{ lease.fate }}</td>
        </tr>
      {% endfor %}
    </tbody>
  </table>
{% else %}
  <p>The request won no lease.</p>
{% endif %}
"""


@functools.cache
def _template() -> Template:
    # An engine of its own: the panel renders whatever the project's TEMPLATES are.
    return Engine().from_string(_TEMPLATE)


class StampedePanel(Panel):
    """The cache calls of the request, as ``django_stampede`` saw them: add
    ``"django_stampede.debug_toolbar.StampedePanel"`` to
    ``DEBUG_TOOLBAR_PANELS``, and ``OPTIONS["RECORD_CALLS"] = True`` to each
    cache to show. Works for sync and async views."""

    is_async = True
    title = "Stampede: the cache calls of this request"
    nav_title = "Stampede"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._recording = ExitStack()
        self._recorder: Recorder | None = None

    def enable_instrumentation(self) -> None:
        # Called in the request's context, before the view: the view's calls,
        # and those of the threads and tasks that carry its context
        # (sync_to_async's, asyncio's), record into this.
        self._recorder = self._recording.enter_context(recording())

    def disable_instrumentation(self) -> None:
        self._recording.close()

    def generate_stats(self, request: HttpRequest, response: HttpResponse) -> None:
        recorder = self._recorder
        calls = [] if recorder is None else call_rows(recorder.calls)
        counted = [_COUNTED.get(call.kind) for call in calls]
        counts = {name: counted.count(name) for name in _ORDER if name in counted}
        toolbar_panel: Any = self  # through Any: the toolbar does not annotate its methods
        toolbar_panel.record_stats(
            {
                "calls": as_dicts(calls),
                "leases": as_dicts([] if recorder is None else lease_rows(recorder)),
                "counts": counts,
                # Nested calls' time is their caller's already.
                "total_ms": round(sum(call.ms for call in calls if call.depth == 0), 2),
                "silent": _silent_caches(),
            }
        )

    def _stats(self) -> dict[str, Any]:
        """What :meth:`generate_stats` recorded (kept by the toolbar, as JSON)."""
        toolbar_panel: Any = self  # through Any: the toolbar does not annotate its methods
        stats: dict[str, Any] = toolbar_panel.get_stats()
        return stats

    @property
    def nav_subtitle(self) -> str:
        stats = self._stats()
        calls = len(stats.get("calls", ()))
        text = f"{calls} call{'' if calls == 1 else 's'} in {stats.get('total_ms', 0):.2f} ms"
        counts = stats.get("counts", {})
        told = [
            f"{count} {name if count == 1 else _PLURALS.get(name, name)}" for name, count in counts.items()
        ]
        return f"{text}: {', '.join(told)}" if told else text

    @property
    def content(self) -> str:
        context = {
            **self._stats(),
            "summary": self.nav_subtitle,
            "highlighted": ("wait", "fail-open", "error"),
        }
        rendered: str = _template().render(Context(context))
        return rendered


def _silent_caches() -> list[str]:
    """The aliases of the ``StampedeCache`` caches that do not record their calls."""
    silent = []
    for alias, entry in caches.settings.items():
        try:
            backend = import_string(entry.get("BACKEND", ""))
        except ImportError:
            continue
        records = (entry.get("OPTIONS") or {}).get("RECORD_CALLS")
        if isinstance(backend, type) and issubclass(backend, StampedeCache) and not records:
            silent.append(str(alias))
    return silent
