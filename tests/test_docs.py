"""Every code block of README.md and docs/**/*.md runs, or is checked, as written.

A page is one test (its id is its path), so a failure names the page; the
message holds the failing block's first lines and the traceback or the
command. The API reference (``docs/reference/``, ``:::`` directives only) and
``docs/changelog.md`` (CHANGELOG.md, included) hold no blocks of their own.

How to write a page's code blocks
=================================

Every fenced block needs a language this test handles; any other (or none)
fails the page, so that no block can rot unseen:

``python``
    Run. The Python blocks of a page run in order in one process of their
    own (``sys.executable``, working directory a fresh temporary one,
    ``PYTHONPATH`` the repository and ``integrations/``), in one shared
    namespace, like a doctest session: a block may use what an earlier one
    defined. That namespace is the process's ``__main__``, so pickle finds
    the classes and functions the page defines. A ``DeprecationWarning`` is
    an error there, as in the suite. A block fails the page by raising
    (``assert`` says what a reader should see); what it prints is not
    compared with anything.

    Redis: the page gets a redis-server of its own. Write snippets against
    ``redis://localhost:6379`` (what a newcomer runs): every occurrence of
    that text in the page's code is replaced by the server's URL, which is
    also in the environment as ``REDIS_URL`` and ``STAMPEDE_REDIS_URL``. A
    client made without that URL (``redis.Redis()``) finds nothing there.

    Top-level ``await`` (and ``async with``, ``async for``) works: such a
    block runs on the page's event loop, one loop on a thread of its own for
    the whole page, so that an asyncio client made in one block can be
    awaited in the next. Blocks without a top-level ``await`` run on the main
    thread, where no loop runs, as in a script.

``python title="settings.py"``
    A Django settings module (any title whose file name is ``settings.py``):
    run in a namespace of its own (``__file__`` is ``settings.py``); then
    Django is configured from its upper-case names, and every alias of its
    ``CACHES`` (but a ``DummyCache``) must store a value and return it.
    Defaults are added for what a settings file holds anyway and the
    fragment leaves out: ``SECRET_KEY``, ``INSTALLED_APPS`` (contenttypes and
    auth), ``ALLOWED_HOSTS = ["*"]``, and ``ROOT_URLCONF = "urls"`` when the
    page has a ``python title="urls.py"`` block. The page's later blocks run
    with Django configured, in the same process: a page's settings block
    comes before the blocks that use Django. A second settings block on a
    page applies its names over the first's, as Django's
    ``override_settings`` does (caches included).

``python title="project/conftest.py"``, ``title="project/test_x.py"``
    A test project's files (``conftest.py``, ``test_*.py``), by folder: not
    run in the page's process; written to a fresh directory per folder and
    run by ``python -m pytest`` there, which must pass and run at least one
    test (their fixtures start the Redis they need).

``python title="views.py"`` (``urls.py``, ``app.py``...)
    Run in the page's namespace like any Python block; afterwards the
    namespace is importable under the title's name too (``urls``, for
    ``ROOT_URLCONF``).

``sh``, ``bash``, ``console``
    Not run: each command is checked. A command is a line (a ``$ `` prompt
    stripped, a trailing ``# comment`` dropped, lines ending in ``\\``
    joined); blank and comment lines are not commands. In a ``console``
    block that has ``$ `` prompts, only the prompted lines are commands: the
    others are their output. Leading ``NAME=value`` assignments are allowed.
    A command must be one of:

    - ``pip install SPEC...`` (or ``python -m pip install``): each SPEC is
      the distribution ``redis-stampede`` (or ``.``, the checkout), its
      extras ones that pyproject.toml's ``optional-dependencies`` define;
      the options allowed are ``-U``/``--upgrade``, ``-e``/``--editable``,
      ``-q``/``--quiet`` and ``--pre``. Nothing is installed.
    - ``make TARGET... [VAR=value...]``: each target a rule of the Makefile,
      each VAR a name the Makefile uses. Nothing is made.
    - ``python -m MODULE [args]`` (``python3`` too): ``python -m MODULE
      --help``, run from the repository, must exit 0.
    - ``mkdocs ...``, ``pytest ...``: the tool is a requirement of one of
      pyproject.toml's extras or dependency groups.
    - ``redis-server ...``, ``docker ...``: allowed as they are.

    Anything else fails the page, naming the line and the command.

``text``
    Output, or anything else shown as is: not run.

A block is kept from running (a Python one is still compiled) by an HTML
comment alone on the line before it (blank lines between allowed)::

    <!-- no-run: why it cannot run here -->

No more than :data:`MAX_NO_RUN` such blocks are allowed across every page
(:func:`test_few_blocks_do_not_run` lists them).

The API reference: every name of the ``__all__`` of each public module has a
``::: module.name`` directive on a page of ``docs/reference/``
(:func:`test_reference_documents_every_public_name`). ``make docs`` builds
the site strictly; this test does not.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from stampede.testing import RedisServer
from tests.snippets import Block, blocks, plan

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency before 3.11
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: The most blocks all pages together may keep from running.
MAX_NO_RUN = 3

#: Seconds a page's Python blocks may take, all together.
PAGE_TIMEOUT = 120

PUBLIC_MODULES = {
    "stampede": "stampede/__init__.py",
    "stampede.asyncio": "stampede/asyncio.py",
    "stampede.testing": "stampede/testing/__init__.py",
    "stampede.testing.fixtures": "stampede/testing/fixtures.py",
    "stampede.cli": "stampede/cli.py",
    "stampede.prometheus": "stampede/prometheus.py",
    "stampede.opentelemetry": "stampede/opentelemetry.py",
    "django_stampede": "integrations/django_stampede/__init__.py",
    "flask_stampede": "integrations/flask_stampede/__init__.py",
}


def _pages() -> list[Path]:
    pages = [ROOT / "README.md"]
    for page in sorted(DOCS.rglob("*.md")):
        relative = page.relative_to(DOCS)
        if relative.parts[0] != "reference" and relative != Path("changelog.md"):
            pages.append(page)
    return pages


PAGES = _pages()


def _id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


# --- the pages ----------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_page(page: Path, tmp_path: Path) -> None:
    """The page's blocks are of known kinds; its commands are ones a reader can
    run; its Python blocks run, in order, against a Redis of their own."""
    found = blocks(page, ROOT)
    unknown = [b for b in found if b.language not in _CHECKS]
    if unknown:
        pytest.fail(
            "\n".join(
                f"{b.path}:{b.line}: a block in {b.language or 'no language'!r}, which this test "
                f"does not handle (python, sh, bash, console, text: see tests/test_docs.py):\n{b.head}"
                for b in unknown
            ),
            pytrace=False,
        )
    # A block kept from running is still Python that compiles.
    problems = [
        problem
        for block in found
        if block.no_run is None or block.language == "python"
        for problem in (_CHECKS[block.language] if block.no_run is None else _check_python)(block)
    ]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    if any(b.language == "python" and b.no_run is None and not b.is_test_file for b in found):
        _run_python(found, tmp_path)
    projects = _test_projects([b for b in found if b.is_test_file and b.no_run is None])
    for project, files in projects.items():
        _run_pytest(project, files, tmp_path / "projects" / project)


def test_few_blocks_do_not_run() -> None:
    """At most MAX_NO_RUN blocks, across every page, are kept from running."""
    kept = [b for page in PAGES for b in blocks(page, ROOT) if b.no_run is not None]
    listing = "\n".join(f"  {b.path}:{b.line} ({b.language}): {b.no_run or 'no reason given'}" for b in kept)
    print(f"{len(kept)} block(s) marked no-run" + (f":\n{listing}" if kept else ""))
    assert all(b.no_run for b in kept), f"a no-run comment without a reason:\n{listing}"
    assert len(kept) <= MAX_NO_RUN, f"{len(kept)} blocks marked no-run, more than {MAX_NO_RUN}:\n{listing}"


def test_reference_documents_every_public_name() -> None:
    """Each name a public module exports has a ``::: module.name`` directive."""
    text = "\n".join(page.read_text(encoding="utf-8") for page in (DOCS / "reference").glob("*.md"))
    documented = set(re.findall(r"^:::\s*(\S+)", text, re.MULTILINE))
    missing = [
        f"{module}.{name}"
        for module, path in PUBLIC_MODULES.items()
        for name in _all_of(ROOT / path)
        if f"{module}.{name}" not in documented
    ]
    assert not missing, f"public names without a ::: directive in docs/reference/: {missing}"


def _all_of(path: Path) -> list[str]:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{path} has no __all__")


# --- python blocks: run ---------------------------------------------------------------


def _run_python(page: list[Block], tmp_path: Path) -> None:
    with RedisServer() as server:
        url = server.url.rsplit("/", 1)[0]  # redis://127.0.0.1:PORT, as redis://localhost:6379
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "STAMPEDE_TEST_"))}
        paths = [str(ROOT), str(ROOT / "integrations"), env.get("PYTHONPATH", "")]
        env.update(
            PYTHONPATH=os.pathsep.join(p for p in paths if p),
            REDIS_URL=url,
            STAMPEDE_REDIS_URL=url,
            PYTHONDONTWRITEBYTECODE="1",
        )
        try:
            done = subprocess.run(
                [sys.executable, "-W", "error::DeprecationWarning", "-m", "tests.snippets"],
                input=json.dumps(plan(page, url, ROOT)),
                capture_output=True,
                text=True,
                cwd=tmp_path,
                env=env,
                timeout=PAGE_TIMEOUT,
            )
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
            pytest.fail(
                f"{page[0].path}: its python blocks took over {PAGE_TIMEOUT} s\n{stderr}", pytrace=False
            )
    if done.returncode != 0:
        output = done.stdout[-2000:]
        pytest.fail(
            f"{done.stderr}" + (f"\n--- the page's output (its end) ---\n{output}" if output.strip() else ""),
            pytrace=False,
        )


# --- test projects: run by pytest ---------------------------------------------------


def _test_projects(found: list[Block]) -> dict[str, list[Block]]:
    """The page's test files, by project: the first folder of their title."""
    projects: dict[str, list[Block]] = {}
    for block in found:
        folder = Path(block.title).parts[0] if len(Path(block.title).parts) > 1 else "."
        projects.setdefault(folder, []).append(block)
    return projects


def _run_pytest(project: str, files: list[Block], where: Path) -> None:
    """Write ``files`` (each under its title, its project folder taken off) and
    run pytest on them, as their reader would: they must pass, with every test
    they define run, against a redis-server the fixtures start themselves."""
    where.mkdir(parents=True)
    for block in files:
        path = where.joinpath(*Path(block.title).parts[1:] or [block.title])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "STAMPEDE_TEST_", "PYTEST_"))}
    paths = [str(where), str(ROOT), str(ROOT / "integrations"), env.get("PYTHONPATH", "")]
    env.update(PYTHONPATH=os.pathsep.join(p for p in paths if p), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "--rootdir",
            where,
        ],
        capture_output=True,
        text=True,
        cwd=where,
        env=env,
        timeout=PAGE_TIMEOUT,
    )
    where_from = ", ".join(f"{b.path}:{b.line}" for b in files)
    if done.returncode != 0 or " passed" not in done.stdout:
        pytest.fail(
            f"the test project {project!r} ({where_from}) failed:\n"
            f"{done.stdout[-3000:]}{done.stderr[-2000:]}",
            pytrace=False,
        )


# --- shell blocks: checked, not run ---------------------------------------------------


def _commands(block: Block) -> Iterator[tuple[int, str]]:
    """The block's commands, with the page line each starts on."""
    lines = block.code.splitlines()
    prompted = block.language == "console" and any(line.startswith("$ ") for line in lines)
    start, pending = 0, ""
    for number, raw in enumerate(lines):
        line = raw.rstrip()
        if not pending:
            start = number
            if prompted and not line.startswith("$ "):
                continue  # output
            line = line.removeprefix("$ ")
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        command, pending = (pending + line).strip(), ""
        if command and not command.startswith("#"):
            yield block.line + start, command


def _check_shell(block: Block) -> list[str]:
    problems = []
    for line, command in _commands(block):
        try:
            words = shlex.split(command, comments=True)
        except ValueError as exc:
            problems.append(f"{block.path}:{line}: {command!r}: {exc}")
            continue
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]
        problem = _check_command(words) if words else None
        if problem:
            problems.append(f"{block.path}:{line}: {command!r}: {problem}")
    return problems


def _check_command(words: list[str]) -> str | None:
    """Why the command is not one the docs may show, or None."""
    tool, args = words[0], words[1:]
    if tool in ("python", "python3") and args[:1] == ["-m"] and len(args) > 1:
        if args[1] == "pip":
            tool, args = "pip", args[2:]
        elif args[1] in ("pytest", "mkdocs"):
            tool, args = args[1], args[2:]
        else:
            return _check_module(args[1])
    if tool == "pip":
        return _check_pip(args)
    if tool == "make":
        return _check_make(args)
    if tool in ("mkdocs", "pytest"):
        return None if tool in _extras_tools() else f"{tool} is in none of pyproject.toml's extras or groups"
    if tool in ("redis-server", "docker"):
        return None
    return "not a command the docs may show (see tests/test_docs.py for the ones they may)"


def _check_pip(args: list[str]) -> str | None:
    if args[:1] != ["install"]:
        return "pip: only pip install"
    specs = []
    for arg in args[1:]:
        if arg.startswith("-"):
            if arg not in ("-U", "--upgrade", "-e", "--editable", "-q", "--quiet", "--pre"):
                return f"pip install: the option {arg} is not one the docs use"
        else:
            specs.append(arg)
    if not specs:
        return "pip install of nothing"
    extras = set(_pyproject()["project"]["optional-dependencies"])
    for spec in specs:
        local = re.fullmatch(r"\.(?:\[(?P<extras>[^\]]*)\])?", spec)
        if local:
            wanted = {e.strip() for e in (local["extras"] or "").split(",") if e.strip()}
        else:
            try:
                requirement = Requirement(spec)
            except InvalidRequirement as exc:
                return f"pip install {spec!r}: {exc}"
            if canonicalize_name(requirement.name) != "redis-stampede":
                return f"pip install {spec!r}: the distribution is redis-stampede"
            wanted = set(requirement.extras)
        unknown = sorted(wanted - extras)
        if unknown:
            return f"pip install {spec!r}: no extra {unknown} in pyproject.toml (it has {sorted(extras)})"
    return None


def _check_make(args: list[str]) -> str | None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = {
        target
        for names in re.findall(r"^([A-Za-z0-9_./ -]+?)\s*::?(?![=:])", makefile, re.MULTILINE)
        for target in names.split()
        if not target.startswith(".")
    }
    wanted = [a for a in args if "=" not in a and not a.startswith("-")]
    if not wanted:
        return "make without a target"
    for target in wanted:
        if target not in targets:
            return f"the Makefile has no target {target!r}"
    for assignment in (a for a in args if "=" in a):
        name = assignment.split("=", 1)[0]
        if not re.search(rf"\b{re.escape(name)}\b", makefile):
            return f"the Makefile uses no variable {name}"
    return None


@functools.cache
def _check_module(module: str) -> str | None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    if done.returncode != 0:
        return f"python -m {module} --help exited {done.returncode}:\n{done.stderr[-1500:]}"
    return None


def _pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        found: dict[str, Any] = tomllib.load(file)
        return found


def _extras_tools() -> set[str]:
    """What pyproject.toml's extras and dependency groups install (a group's
    ``include-group`` entries aside: what they include is listed itself)."""
    project = _pyproject()
    lists = [*project["project"]["optional-dependencies"].values(), *project["dependency-groups"].values()]
    return {
        canonicalize_name(Requirement(spec).name)
        for specs in lists
        for spec in specs
        if isinstance(spec, str)
    }


def _check_python(block: Block) -> list[str]:
    try:
        compile(block.code, block.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except SyntaxError as exc:
        return [f"{block.path}:{block.line + (exc.lineno or 1) - 1}: {exc.msg}\n{block.head}"]
    return []


def _check_text(block: Block) -> list[str]:
    return []  # shown as it is


_CHECKS: dict[str, Callable[[Block], list[str]]] = {
    "python": _check_python,
    "sh": _check_shell,
    "bash": _check_shell,
    "console": _check_shell,
    "text": _check_text,
}
