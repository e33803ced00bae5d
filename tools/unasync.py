"""Generate the blocking twins of stampede's asyncio sources, or check that they agree.

``python tools/unasync.py`` rewrites each twin; ``--check`` only compares
and exits 1 naming the files that would change (``make lint`` runs it, so
an edit to one side alone fails CI). The asyncio file is the source: the
rewrite is by tokens (``async def``, ``await``, ``async for``, ``async with``
and the names in :data:`NAMES`), so the source must be written so that
removing them leaves correct blocking code.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Source (asyncio) -> twin (blocking), relative to the repository.
TWINS = {"stampede/_aoperations.py": "stampede/_operations.py"}

#: Names renamed in the twin.
NAMES = {"AsyncOperations": "Operations"}

_RULES = [
    (re.compile(r"\basync def\b"), "def"),
    (re.compile(r"\bawait "), ""),
    (re.compile(r"\basync (for|with)\b"), r"\1"),
    *((re.compile(rf"\b{old}\b"), new) for old, new in NAMES.items()),
]


def unasync(text: str, source: str, twin: str) -> str:
    """The blocking twin of ``text``, formatted as ``ruff format`` would (lines
    that lost an ``await`` may now fit on one)."""
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    banner = f"# Generated from {source} by tools/unasync.py: edit that file, then run the tool.\n"
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", twin, "-"],
        input=banner + text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return formatted.stdout


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for source, twin in TWINS.items():
        wanted = unasync((ROOT / source).read_text(), source, twin)
        path = ROOT / twin
        if path.exists() and path.read_text() == wanted:
            continue
        if check:
            stale.append(twin)
        else:
            path.write_text(wanted)
            print(f"wrote {twin}")
    if stale:
        print(f"out of date (run python tools/unasync.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
