"""Whether a module can be imported here, without importing it: how a benchmark leaves out, with a
note, a peer or a store whose package is not installed."""

from __future__ import annotations

import importlib.util

__all__ = ["importable"]


def importable(module: str) -> bool:
    """Whether ``module`` (dotted or not) is installed."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a dotted name whose parent package is missing
        return False
