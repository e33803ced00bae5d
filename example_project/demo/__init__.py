"""The demo (``python -m example_project.demo``, or ``make demo``): the example
apps under a real stampede, first on the framework's stock Redis cache, then on
stampede, side by side."""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
