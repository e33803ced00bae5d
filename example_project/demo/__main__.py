"""``python -m example_project.demo [options]`` (what ``make demo`` runs), from
the root of a checkout: see :mod:`example_project.demo.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
