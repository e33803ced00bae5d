"""A Griffe extension (mkdocs.yml) that renders stampede's reST-flavoured docstrings as Markdown.

The docstrings use Google sections (``Args:``, ``Attributes:``) around reST
inline markup, which mkdocstrings would print as it stands. Before they are
parsed, each is rewritten:

- ``:class:`~stampede.Options``` and the other Python roles become
  cross-references. A role naming a public object by its full path
  (``stampede.X``, ``django_stampede.X``, ``flask_stampede.X``) must resolve
  to a documented object: autorefs warns otherwise, which fails ``mkdocs build
  --strict``. Any other role (relative, private, another library's) is looked
  up from the docstring's scope and linked if that object is documented,
  else shown as code.
- ``.. code-block:: lang`` and its indented body, a paragraph of ``>>>``
  lines, and the indented block after a ``::`` become fenced code blocks.
- A simple table (``=====  =====`` borders) becomes a Markdown table.

An attribute without a docstring takes its Sphinx ``#:`` comment (on the
lines above it, or after it on its line) as one, as autodoc would.
"""

from __future__ import annotations

import html
import re
import textwrap
from typing import Any

import griffe

_PACKAGES = ("stampede", "django_stampede", "flask_stampede")

_ROLE = re.compile(
    r":(?:py:)?(?P<role>class|func|meth|attr|exc|mod|data|obj|const):`(?P<tilde>~?)(?P<body>[^`]+)`"
)
_CODE_BLOCK = re.compile(r"^(?P<indent>\s*)\.\. (?:code-block|code|sourcecode)::\s*(?P<lang>\S*)\s*$")
_BORDER = re.compile(r"^\s*=+( +=+)+\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


class RstToMarkdown(griffe.Extension):
    """Rewrites every docstring of a loaded package from reST to Markdown."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _walk(pkg, set()):
            if obj.is_attribute and obj.docstring is None:
                _comment_docstring(obj)
            if obj.docstring is not None:
                obj.docstring.value = convert(obj.docstring.value, obj)


def _walk(obj: griffe.Object, seen: set[str]) -> Any:
    if obj.path in seen:
        return
    seen.add(obj.path)
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member, seen)  # type: ignore[arg-type]


def _comment_docstring(attr: griffe.Object) -> None:
    """Give ``attr`` the text of its ``#:`` comment as a docstring, if it has one."""
    try:
        lines = attr.lines_collection[attr.filepath]  # type: ignore[index]
    except (KeyError, TypeError):
        return
    if not attr.lineno or attr.lineno > len(lines):
        return
    own = lines[attr.lineno - 1]
    text = [own.split("#:", 1)[1].strip()] if "#:" in own else []
    above = attr.lineno - 2
    while not text and above >= 0 and lines[above].lstrip().startswith("#:"):
        above -= 1
    if not text:
        text = [line.lstrip()[2:].strip() for line in lines[above + 1 : attr.lineno - 1]]
    if any(text):
        attr.docstring = griffe.Docstring("\n".join(text), lineno=attr.lineno, parent=attr)


def convert(text: str, scope: griffe.Object | None = None) -> str:
    """``text`` (a docstring) with its reST markup rewritten as Markdown."""
    lines = _blocks(text.splitlines())
    out: list[str] = []
    fenced = False
    for line in lines:
        if _FENCE.match(line):
            fenced = not fenced
        out.append(line if fenced else _ROLE.sub(lambda m: _reference(m, scope), line))
    return "\n".join(out)


def _reference(match: re.Match[str], scope: griffe.Object | None) -> str:
    role, body = match["role"], match["body"].strip()
    title, _, explicit = body.partition("<")
    if explicit:  # :class:`the title <target>`
        target, title = explicit.rstrip(">").strip(), title.strip()
    else:
        target = body
        title = target.rsplit(".", 1)[-1] if match["tilde"] else target
        if role in ("func", "meth"):
            title += "()"
    public = target.split(".", 1)[0] in _PACKAGES and "." in target
    if public and not any(part.startswith("_") for part in target.split(".")):
        return f"[`{title}`][{target}]"  # must resolve: a documented object
    identifier = html.escape(_resolve(target, scope))
    return f'<autoref identifier="{identifier}" optional><code>{html.escape(title)}</code></autoref>'


def _resolve(target: str, scope: griffe.Object | None) -> str:
    """The full path of ``target`` as Python would find it from ``scope``, if it can."""
    if scope is None or target.split(".", 1)[0] in _PACKAGES:
        return target
    first, dot, rest = target.partition(".")
    here: griffe.Object | None = scope
    while here is not None:
        members = here.all_members if here.is_class else here.members
        if first in members:
            member = members[first]
            try:
                found = member.final_target if isinstance(member, griffe.Alias) else member
                return found.path + dot + rest
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                return member.path + dot + rest
        if here.name == first and not here.is_module:
            return here.path + dot + rest
        here = here.parent
    return target


def _blocks(lines: list[str]) -> list[str]:
    """``lines`` with reST's block markup (code blocks, doctests, tables) as Markdown."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = line[: len(line) - len(line.lstrip())]
        directive = _CODE_BLOCK.match(line)
        if _FENCE.match(line):  # already Markdown: copied as it stands
            end = next((j for j in range(i + 1, len(lines)) if _FENCE.match(lines[j])), len(lines) - 1)
            out.extend(lines[i : end + 1])
            i = end + 1
        elif directive:
            body, i = _indented_body(lines, i + 1, indent)
            out.extend(_fence(directive["lang"] or "python", body, indent))
        elif line.lstrip().startswith(">>>"):
            end = i
            while end < len(lines) and lines[end].strip() and lines[end].startswith(indent):
                end += 1
            out.extend(_fence("pycon", [entry[len(indent) :] for entry in lines[i:end]], indent))
            i = end
        elif _BORDER.match(line):
            table, i = _table(lines, i)
            out.extend(table)
        elif line.rstrip().endswith("::") and not line.lstrip().startswith(".."):
            literal = line.rstrip()[:-2].rstrip()
            if literal:
                out.append(literal + ":")
            body, i = _indented_body(lines, i + 1, indent)
            if body:
                out.append("")
                out.extend(_fence("text", body, indent))
        else:
            out.append(line)
            i += 1
    return out


def _indented_body(lines: list[str], start: int, indent: str) -> tuple[list[str], int]:
    """The block indented deeper than ``indent`` from ``start`` (blank lines
    before it skipped), dedented, and the index of the line after it."""
    end = start
    while end < len(lines) and not lines[end].strip():
        end += 1
    first = end
    while end < len(lines) and (
        not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > len(indent)
    ):
        end += 1
    while end > first and not lines[end - 1].strip():
        end -= 1
    return textwrap.dedent("\n".join(lines[first:end])).splitlines(), end


def _fence(lang: str, body: list[str], indent: str) -> list[str]:
    return [f"{indent}```{lang}", *(f"{indent}{entry}".rstrip() for entry in body), f"{indent}```"]


def _table(lines: list[str], start: int) -> tuple[list[str], int]:
    """A reST simple table from its first border: as a Markdown table, and the
    index of the line after it. Lines whose first cell is blank continue the
    row above; without a header row, the Markdown table's header is empty."""
    border = lines[start]
    indent = border[: len(border) - len(border.lstrip())]
    spans = [m.span() for m in re.finditer(r"=+", border)]
    header: list[str] = [""] * len(spans)
    rows, i = _rows(lines, start + 1, spans)
    if i + 1 < len(lines) and lines[i + 1].strip():  # a line right after the border: a header above
        header = [" ".join(cells) for cells in zip(*rows, strict=True)] if rows else header
        rows, i = _rows(lines, i + 1, spans)
    table = [
        indent + "| " + " | ".join(header) + " |",
        indent + "|" + "|".join("---" for _ in spans) + "|",
        *(indent + "| " + " | ".join(cell.replace("|", r"\|") for cell in row) + " |" for row in rows),
    ]
    return ["", *table, ""], i + 1


def _rows(lines: list[str], start: int, spans: list[tuple[int, int]]) -> tuple[list[list[str]], int]:
    """The rows from ``start`` up to the next border, and that border's index."""
    rows: list[list[str]] = []
    i = start
    while i < len(lines) and not _BORDER.match(lines[i]):
        line = lines[i]
        cells = [(line[a:b] if k < len(spans) - 1 else line[a:]).strip() for k, (a, b) in enumerate(spans)]
        if rows and not cells[0]:
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells, strict=True)]
        elif any(cells):
            rows.append(cells)
        i += 1
    return rows, i
