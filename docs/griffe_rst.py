"""A griffe extension for the API reference: embforge's docstrings use a few reStructuredText habits (``code``,
``:func:`name```, ``.. math::`` and simple ``====`` tables) that Markdown would misread (a ``====`` line makes a
heading). Each docstring is rewritten to the Markdown that shows the same thing before mkdocstrings renders it."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj|const|ref|py:\w+):`~?([^`]+)`")
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``")
_RULE = re.compile(r"^\s*=+(\s+=+)+\s*$")


def _fence_tables(lines: list[str]) -> list[str]:
    """Simple tables (three ``=== ===`` rules) kept as they are, in a text block."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if _RULE.match(lines[i]):
            rules = [j for j in range(i, len(lines)) if _RULE.match(lines[j])][:3]
            if len(rules) == 3:
                indent = re.match(r"\s*", lines[i]).group(0)
                out += [f"{indent}```text", *lines[i : rules[2] + 1], f"{indent}```"]
                i = rules[2] + 1
                continue
        out.append(lines[i])
        i += 1
    return out


def _math_blocks(lines: list[str]) -> list[str]:
    """``.. math:: formula`` (and its indented continuation) as a text block."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        found = re.match(r"(\s*)\.\. math::\s*(.*)$", lines[i])
        if not found:
            out.append(lines[i])
            i += 1
            continue
        indent, body = found.group(1), [found.group(2)] if found.group(2) else []
        i += 1
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(indent)
        ):
            body.append(lines[i].strip())
            i += 1
        out += [f"{indent}```text", *(f"{indent}{b}" for b in body if b), f"{indent}```"]
    return out


def _fence_doctests(lines: list[str]) -> list[str]:
    """A doctest (``>>>`` lines and their output, up to a blank line) as a ``pycon`` block: in an ``Example:``
    section Markdown would otherwise read it as prose (``[a][b]`` in its output as a link)."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith(">>>"):
            out.append(lines[i])
            i += 1
            continue
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return out


def to_markdown(text: str) -> str:
    """The Markdown of one reStructuredText-flavoured docstring."""
    lines = _fence_doctests(_math_blocks(_fence_tables(text.splitlines())))
    fenced, out = False, []
    for line in lines:
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            line = _ROLE.sub(r"`\1`", line)
            line = _MATH_ROLE.sub(r"`\1`", line)
            line = _LITERAL.sub(r"`\1`", line)
            line = re.sub(r"(\S)::$", r"\1:", line)
        out.append(line)
    return "\n".join(out)


class RstToMarkdown(griffe.Extension):
    """Rewrites every object's docstring with :func:`to_markdown` as griffe loads it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
