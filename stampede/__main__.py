"""The ``stampede`` command (also ``python -m stampede``).

``stampede demo [options]`` puts the example Django site and Flask app under
a cache stampede, first on their stock Redis caches, then on stampede. The
example apps live in the ``example_project`` directory of stampede's source
tree, beside this package, and need its ``demo`` extra (``pip install -e
'.[demo]'`` in a checkout, or ``make demo``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["main"]


def _example_project_demo() -> ModuleType:
    """Import ``example_project.demo`` from the path, the current directory or the source tree."""
    try:
        return importlib.import_module("example_project.demo")
    except ModuleNotFoundError as exc:
        if exc.name != "example_project":
            raise
    for root in (Path.cwd(), Path(__file__).resolve().parent.parent):
        if (root / "example_project" / "demo" / "__init__.py").is_file():
            sys.path.insert(0, str(root))
            return importlib.import_module("example_project.demo")
    raise SystemExit(
        "stampede demo: the example_project directory of stampede's source tree was not found; "
        "run it from a checkout of the repository (make demo)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stampede", description="Cache stampede protection on Redis.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    # The demo parses its own options (``stampede demo --help``).
    commands.add_parser(
        "demo", help="the example apps under a stampede, stock cache then stampede", add_help=False
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        result: int = _example_project_demo().main(rest)
        return result
    parser.error(f"unknown command {args.command!r}")  # argparse has refused it already


if __name__ == "__main__":
    sys.exit(main())
