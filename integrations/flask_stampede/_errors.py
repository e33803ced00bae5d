"""How the extension and the Flask-Caching backend report a setting they
cannot use: a :class:`stampede.ConfigurationError` naming it as written."""

from __future__ import annotations

import difflib

import stampede

__all__ = ["bad", "close_match"]


def bad(setting: str, problem: str) -> stampede.ConfigurationError:
    """The error for ``setting`` (``"STAMPEDE_WAIT_TIMEOUT"``, ``"CACHE_OPTIONS['x']"``...)."""
    return stampede.ConfigurationError(f"flask_stampede: {setting} {problem}")


def close_match(name: str, known: list[str]) -> str:
    """`` Did you mean 'x'?`` for the known name closest to ``name``, if any is close."""
    close = difflib.get_close_matches(name, known, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
