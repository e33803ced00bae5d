"""The code blocks of the Markdown pages, and the runner of a page's Python blocks.

``tests/test_docs.py`` says what the blocks may hold and how each kind is
checked. This module parses the pages (:func:`blocks`) and, run as
``python -m tests.snippets`` with a page's plan as JSON on its standard input
(:func:`plan`), executes that page's Python blocks in one process (:func:`main`).
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
import json
import re
import sys
import textwrap
import threading
import traceback
import types
from pathlib import Path
from typing import Any

#: What the snippets are written against, replaced by the test's own server.
DEFAULT_URL = "redis://localhost:6379"

#: The one-line HTML comment that keeps the block after it from running.
_NO_RUN = re.compile(r"^\s*<!--\s*no-run:\s*(?P<reason>.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_TITLE = re.compile(r"""\btitle\s*=\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>\S+))""")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    path: str  # the page, relative to the repository
    line: int  # 1-based line of the block's first line of code
    language: str  # the info string's first word, lower-cased ("" if none)
    title: str  # the info string's title="..." ("" if none)
    code: str  # dedented by the fence's indentation
    no_run: str | None  # the reason of a <!-- no-run: ... --> comment before it, if any

    @property
    def head(self) -> str:
        """The block's first lines, to name it in a failure."""
        lines = self.code.splitlines()
        more = "\n    ..." if len(lines) > 6 else ""
        return textwrap.indent("\n".join(lines[:6]), "    ") + more

    @property
    def is_test_file(self) -> bool:
        """A file of a test project a page shows (``python title="x/conftest.py"``,
        ``title="x/test_views.py"``): run by pytest, not in the page's process."""
        name = Path(self.title).name
        return self.language == "python" and (name == "conftest.py" or name.startswith("test_"))

    @property
    def is_settings(self) -> bool:
        """A Django settings module: ``python title="settings.py"``."""
        return self.language == "python" and Path(self.title).name == "settings.py"


def blocks(page: Path, root: Path) -> list[Block]:
    """The fenced code blocks of ``page``, in order (an unclosed fence runs to the end)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, info = opening["indent"], opening["fence"], opening["info"].strip()
        end = i + 1
        while end < len(lines):
            closing = re.match(r"^[ \t]*(`{3,}|~{3,})\s*$", lines[end])
            if closing and closing[1][0] == fence[0] and len(closing[1]) >= len(fence):
                break
            end += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : end]
        ]
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _NO_RUN.match(before)
        title = _TITLE.search(info)
        found.append(
            Block(
                path=page.relative_to(root).as_posix(),
                line=i + 2,
                language=(info.split() or [""])[0].lstrip(".{").lower(),
                title=(title["dq"] or title["sq"] or title["bare"] or "") if title else "",
                code="\n".join(body) + "\n",
                no_run=marker["reason"] if marker else None,
            )
        )
        i = end + 1
    return found


def plan(page: list[Block], url: str, root: Path) -> dict[str, Any]:
    """What :func:`main` runs of a page: its Python blocks that are to run, in
    order, with ``redis://localhost:6379`` replaced by ``url``."""
    python = [
        block
        for block in page
        if block.language == "python" and block.no_run is None and not block.is_test_file
    ]
    return {
        "blocks": [
            {
                "path": block.path,
                "file": str(root / block.path),
                "line": block.line,
                "title": block.title,
                "settings": block.is_settings,
                "head": block.head,
                "code": block.code.replace(DEFAULT_URL, url),
            }
            for block in python
        ],
        "modules": sorted({Path(b.title).stem for b in python if b.title and not b.is_settings}),
    }


# --- the runner: one page, in its own process ------------------------------------


class _Loop:
    """An event loop on a thread of its own, for the blocks with a top-level
    ``await``: the blocks of a page share it, so that a client made in one is
    still usable in the next, while the other blocks run on the main thread,
    where nothing is running (as in a script)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="snippets-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        async def drain() -> None:  # what the blocks left running, as asyncio.run would
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        self.run(drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


def _compile(block: dict[str, Any]) -> types.CodeType:
    # Padded so that tracebacks name the page's own lines.
    source = "\n" * (block["line"] - 1) + block["code"]
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    code: types.CodeType = compile(source, block["file"], "exec", flags=flags, dont_inherit=True)
    return code


def _run(block: dict[str, Any], namespace: dict[str, Any], loop: _Loop) -> None:
    result = eval(_compile(block), namespace)  # a coroutine where the block awaits at top level
    if inspect.iscoroutine(result):
        loop.run(result)


def _configure_django(block: dict[str, Any], namespace: dict[str, Any], modules: list[str]) -> None:
    """Configure Django from a settings block's upper-case names, then check
    that every cache it declares stores and returns a value."""
    import django
    from django.conf import settings

    values = {name: value for name, value in namespace.items() if name.isupper()}
    values.setdefault("SECRET_KEY", "docs-snippets-" + "k" * 50)
    values.setdefault("INSTALLED_APPS", ["django.contrib.contenttypes", "django.contrib.auth"])
    values.setdefault("ALLOWED_HOSTS", ["*"])
    if "urls" in modules:
        values.setdefault("ROOT_URLCONF", "urls")
    if not settings.configured:
        settings.configure(**values)
        django.setup()
    else:  # a second settings block: as Django's own tests change settings
        from django.test.utils import override_settings

        # The apps last: override_settings loads them before the other names,
        # and an app's ready() may read those (django-debug-toolbar's reads
        # STATIC_URL and DEBUG_TOOLBAR_PANELS).
        installed = values.pop("INSTALLED_APPS")
        override_settings(**values).enable()
        override_settings(INSTALLED_APPS=installed).enable()
    from django.core.cache import caches

    for alias, config in settings.CACHES.items():
        if str(config.get("BACKEND", "")).endswith("DummyCache"):
            continue
        cache = caches[alias]
        try:
            cache.set("docs-snippets:round-trip", {"alias": alias}, 30)
            found = cache.get("docs-snippets:round-trip")
            cache.delete("docs-snippets:round-trip")
        except Exception as exc:
            raise AssertionError(f"CACHES[{alias!r}]: a set and get failed: {exc!r}") from exc
        assert found == {"alias": alias}, f"CACHES[{alias!r}] stored a value but returned {found!r}"


def _traceback(exc: BaseException, file: str) -> str:
    """The traceback of ``exc`` from the page's own frames on (the runner's left out)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != file:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def main() -> int:
    """Run the plan on standard input: every block in order, the Python ones
    in one namespace, a settings block in its own that then configures Django."""
    spec = json.load(sys.stdin)
    # The page is the program: its own __main__, so that pickle finds the
    # classes and functions it defines (stampede pickles values by default).
    page = types.ModuleType("__main__")
    sys.modules["__main__"] = page
    namespace = page.__dict__
    loop = _Loop()
    try:
        for block in spec["blocks"]:
            try:
                if block["settings"]:
                    settings_ns: dict[str, Any] = {"__name__": "settings", "__file__": "settings.py"}
                    _run(block, settings_ns, loop)
                    _configure_django(block, settings_ns, spec["modules"])
                else:
                    _run(block, namespace, loop)
                    if block["title"]:  # views.py, urls.py, app.py: importable by that name too
                        module = types.ModuleType(Path(block["title"]).stem)
                        module.__dict__.update(namespace)
                        module.__name__ = Path(block["title"]).stem
                        sys.modules[module.__name__] = module
            except BaseException as exc:
                kind = f'python title="{block["title"]}"' if block["title"] else "python"
                print(
                    f"{block['path']}:{block['line']}: the {kind} block starting there failed:\n"
                    f"{block['head']}\n\n{_traceback(exc, block['file'])}",
                    file=sys.stderr,
                )
                return 1
    finally:
        sys.stdout.flush()
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
