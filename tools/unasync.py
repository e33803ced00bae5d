"""Generate the blocking twins of stampede's asyncio sources, or check that they agree.

``python tools/unasync.py`` rewrites each twin; ``--check`` only compares
and exits 1 naming the files that would change (``make lint`` runs it, so
an edit to one side alone fails CI). The asyncio file is the source: the
rewrite is by tokens (``async def``, ``await``, ``async for``, ``async with``,
and the names below), so the source must be written so that removing them
leaves correct blocking code. What truly differs between the flavours is in
``stampede/_primitives/``, where each ``AsyncX`` or ``async_x`` has its
blocking twin ``X`` or ``x``. A rule that no source uses is an error, so the
rules cannot rot.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Source (asyncio) -> twin (blocking), relative to the repository.
TWINS = {
    "stampede/_async/groups.py": "stampede/_sync/groups.py",
    "stampede/_async/keeper.py": "stampede/_sync/keeper.py",
    "stampede/_async/lease_api.py": "stampede/_sync/lease_api.py",
    "stampede/_async/lookups.py": "stampede/_sync/lookups.py",
    "stampede/_async/operations.py": "stampede/_sync/operations.py",
    "stampede/_async/reads.py": "stampede/_sync/reads.py",
    "stampede/_async/runner.py": "stampede/_sync/runner.py",
    "stampede/_async/server.py": "stampede/_sync/server.py",
    "stampede/_async/stampede.py": "stampede/_sync/stampede.py",
    "stampede/_async/subscriber.py": "stampede/_sync/subscriber.py",
}

#: (pattern, replacement), applied in this order to every source.
RULES = [
    (r"\basync def\b", "def"),
    (r"\bawait ", ""),
    (r"\basync (for|with)\b", r"\1"),
    # The flavour primitives, and the classes named for their flavour.
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\basync_(\w+)", r"\1"),
    # redis-py's and the instances' own closing and context managers.
    (r"\baclose\b", "close"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\basynchronous=True\b", "asynchronous=False"),
    # A decorated coroutine function returns an awaitable; a blocking one, the value.
    (r"\bCachedFunction\[Awaitable\[Any\]\]", "CachedFunction[Any]"),
]

_COMPILED = [(re.compile(pattern), replacement) for pattern, replacement in RULES]


def unasync(text: str, source: str, twin: str, used: set[str]) -> str:
    """The blocking twin of ``text``, with the imports it no longer needs
    dropped and formatted as ``ruff format`` would (lines that lost an
    ``await`` may now fit on one). ``used`` gains the patterns that matched."""
    for pattern, replacement in _COMPILED:
        text, count = pattern.subn(replacement, text)
        if count:
            used.add(pattern.pattern)
    banner = f"# Generated from {source} by tools/unasync.py: edit that file, then run the tool.\n"
    text = _ruff(["check", "--fix-only", "--select", "F401,I", "--exit-zero"], twin, banner + text)
    return _ruff(["format"], twin, text)


def _ruff(args: list[str], filename: str, text: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", filename, "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return done.stdout


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    used: set[str] = set()
    for source, twin in TWINS.items():
        wanted = unasync((ROOT / source).read_text(), source, twin, used)
        path = ROOT / twin
        if path.exists() and path.read_text() == wanted:
            continue
        if check:
            stale.append(twin)
        else:
            path.write_text(wanted)
            print(f"wrote {twin}")
    unused = [pattern for pattern, _ in RULES if pattern not in used]
    if unused:
        print(f"rules no source uses (remove them): {', '.join(unused)}", file=sys.stderr)
        return 1
    if stale:
        print(f"out of date (run python tools/unasync.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
