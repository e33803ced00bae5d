"""Output: number formatting, Markdown tables, sections, the whole document; progress on stderr."""

from __future__ import annotations

import datetime
import math
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "Section",
    "Table",
    "environment_line",
    "micros",
    "millis",
    "progress",
    "render_document",
    "render_section",
    "render_table",
]


def millis(seconds: float) -> str:
    """``0.2034`` -> ``"203.4 ms"``."""
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.1f} ms"


def micros(seconds: float) -> str:
    """``0.0000451`` -> ``"45.1 µs"``."""
    return "n/a" if math.isnan(seconds) else f"{seconds * 1e6:.1f} µs"


@dataclass(frozen=True)
class Table:
    """A Markdown table; ``align`` has one letter per column, ``l`` or ``r``."""

    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    align: str = ""

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.headers):
                raise ValueError(
                    f"row {row!r} has {len(row)} cells, the table has {len(self.headers)} columns"
                )


@dataclass(frozen=True)
class Section:
    """One scenario's results: a heading, what was measured, the table, and notes under it."""

    title: str
    intro: str
    table: Table
    notes: Sequence[str] = field(default_factory=tuple)


def render_table(table: Table) -> str:
    """The table with its columns padded to equal width, so it reads well as plain text too."""
    columns = len(table.headers)
    align = (table.align or "l" * columns).ljust(columns, "l")
    cells = [list(table.headers), *(list(row) for row in table.rows)]
    widths = [max(3, *(len(row[i]) for row in cells)) for i in range(columns)]

    def line(row: Sequence[str]) -> str:
        padded = (
            cell.rjust(width) if side == "r" else cell.ljust(width)
            for cell, width, side in zip(row, widths, align, strict=True)
        )
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(
        ("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2)) for w, a in zip(widths, align, strict=True)
    )
    return "\n".join([line(table.headers), rule + "|", *(line(row) for row in table.rows)])


def render_section(section: Section) -> str:
    parts = [f"## {section.title}", section.intro, render_table(section.table)]
    if section.notes:
        parts.append("\n".join(f"- {note}" for note in section.notes))
    return "\n\n".join(parts)


def _cpu_model() -> str:
    """The processor's name where the system says it (Linux), else ``""``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                if name.strip() == "model name" and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor()


def environment_line(redis_version: str, *, quick: bool) -> str:
    """Date, Python version, redis-server version, CPU count and model, on one line."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    kind = "quick run" if quick else "full run"
    model = _cpu_model()
    cpus = f"{os.cpu_count()} CPUs{f' ({model})' if model else ''}"
    return (
        f"{now} · Python {platform.python_version()} · redis-server {redis_version} · "
        f"{cpus} · {platform.system()} {platform.machine()} · {kind}"
    )


def render_document(environment: str, sections: Sequence[Section], footer: str = "") -> str:
    parts = [environment, "# stampede and its peers: benchmark", *(render_section(s) for s in sections)]
    if footer:
        parts.append(footer)
    return "\n\n".join(parts) + "\n"


def progress(message: str) -> None:
    """One line of progress on stderr (``[bench] message``): stdout carries the results alone."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)
