"""``python -m stampede``: see :mod:`stampede.cli`."""

from .cli import main

raise SystemExit(main())
