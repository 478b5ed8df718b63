"""Standard column names, column mappings, and the strict number parsing every reader shares.

A *mapping* ``{"source": "standard"}`` names a file's columns: a source is a header name (any text, spaces and
``#`` included) or a 0-based position. Standard names are matched whatever their case (``Sentence1``). The
columns a mapping does not name keep their standard names, unless a mapped column takes that name (``category=label``
on ``text, category, label`` reads ``text`` and the ``category`` column as ``label``); others are left out.

Numbers are parsed strictly: decimal literals only (``4``, ``-0.5``, ``1e-3``), no underscores (``1_0``), no
hexadecimal, no booleans, and a score must be finite.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping

from embforge.files import DataError

TEXT_ORDER = ("sentence1", "sentence2", "anchor", "positive", "text")
LABEL_NAMES = ("score", "label")
NEGATIVE = re.compile(r"^negative(_\d+)?$")
STANDARD_HELP = "sentence1, sentence2, score, anchor, positive, negative[_N], text or label"

_DECIMAL = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_SPECIAL = re.compile(r"^[+-]?(nan|inf|infinity)$", re.IGNORECASE)


def is_text_column(name: str) -> bool:
    return name in TEXT_ORDER or bool(NEGATIVE.match(name))


def standard_name(name: str) -> str | None:
    """The standard column ``name`` stands for (case and surrounding spaces ignored), else ``None``."""
    lowered = name.strip().lower()
    if lowered in TEXT_ORDER or lowered in LABEL_NAMES or NEGATIVE.match(lowered):
        return lowered
    return None


def column_rank(name: str) -> tuple[int, int]:
    """Sort key putting text columns in their canonical order (``anchor, positive, negative, negative_1 ...``)."""
    if name in TEXT_ORDER:
        return (TEXT_ORDER.index(name), 0)
    match = NEGATIVE.match(name)
    assert match is not None
    return (len(TEXT_ORDER), int(match.group(1)[1:]) if match.group(1) else 0)


class NamedColumns:
    """Mixin: the text and label columns among a row source's ``columns`` (a table read in memory, an Arrow cache,
    a stream)."""

    columns: Collection[str]

    @property
    def text_columns(self) -> list[str]:
        """Text column names in their canonical order (``sentence1, sentence2`` / ``anchor, positive, negative…``)."""
        return sorted((c for c in self.columns if is_text_column(c)), key=column_rank)

    @property
    def label_column(self) -> str | None:
        """The label column (``score`` or ``label``), or ``None``."""
        return next((c for c in LABEL_NAMES if c in self.columns), None)


def parse_columns(spec: str | Mapping[str, str] | None) -> dict[str, str]:
    """Parse ``"a=sentence1,#1 String=sentence2"`` (or a dict) into ``{source: target}``.

    Sources are header names (spaces and ``#`` allowed; a name holding ``,`` or ``=`` needs the dict form) or
    0-based positions; targets are not checked here (see :func:`standard_mapping`).

    >>> parse_columns("Quality=label, #1 String=sentence1")
    {'Quality': 'label', '#1 String': 'sentence1'}
    """
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        return {str(k): str(v) for k, v in spec.items()}
    mapping: dict[str, str] = {}
    for item in spec.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"--columns item {item!r} must look like SOURCE=STANDARD (e.g. 0=sentence1)")
        source, target = (part.strip() for part in item.split("=", 1))
        if source in mapping:
            raise ValueError(f"--columns names {source!r} twice")
        mapping[source] = target
    return mapping


def standard_mapping(spec: str | Mapping[str, str] | None) -> dict[str, str]:
    """:func:`parse_columns` with every target checked and spelled as a standard name (``Label`` -> ``label``)."""
    mapping = {}
    for source, target in parse_columns(spec).items():
        standard = standard_name(target)
        if standard is None:
            raise ValueError(f"unknown standard column {target!r} in the column mapping; use {STANDARD_HELP}")
        mapping[source] = standard
    return mapping


def is_position(source: str) -> bool:
    return source.isdigit()


def named_sources(mapping: Mapping[str, str]) -> list[str]:
    """The mapping's sources that are names rather than positions (they need a header)."""
    return [s for s in mapping if not is_position(s)]


def check_unique_targets(mapping_used: Mapping[str, str], where: str) -> None:
    """Fail when two source columns end up with the same standard name (the last one would silently win)."""
    seen: dict[str, str] = {}
    for source, target in mapping_used.items():
        if target in seen:
            raise DataError(
                f"{where} columns {seen[target]!r} and {source!r} both map to {target!r}; map only one of them"
            )
        seen[target] = source


def parse_number(value: object) -> float | None:
    """A strict number: an int/float (not a bool) or a decimal string; ``None`` for anything else.

    ``"nan"``/``"inf"`` parse (so the caller can say "not a finite number"); ``"1_0"``, ``"0x10"``, ``True`` do
    not.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an int too large for a float
            return math.inf
    if isinstance(value, str):
        text = value.strip()
        if _DECIMAL.match(text) or _SPECIAL.match(text):
            return float(text)
    return None


def is_finite_number(value: object) -> bool:
    number = parse_number(value)
    return number is not None and math.isfinite(number)


def as_integer(value: object) -> int | None:
    """An integer label: an int, an integral float or a decimal string such as ``"1"``/``"1.0"``; else ``None``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number = parse_number(value)
    if number is None or not math.isfinite(number) or not number.is_integer():
        return None
    return int(number)
