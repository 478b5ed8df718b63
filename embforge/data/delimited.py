"""CSV and TSV rows: decoding, quoting errors with line and column, and header detection by content.

**Is the first row a header?** ``header=True``/``False`` decides. Otherwise a column mapping that names columns
(rather than positions) means yes. Otherwise the first row is compared with the rows after it (up to
:data:`SAMPLE_ROWS`): it is a header when every cell is a standard or mapped column name, or when the evidence
for it outweighs the evidence against it, one vote per cell:

* a column whose other cells are all numbers: a non-number on the first row votes *header*, a number *data*;
* a column of repeated values (labels: at least 8 rows, at most half of them distinct): a first-row value
  found among them votes *data*, one found nowhere votes *header* (``category`` above ``card_arrival`` rows);
* a column of texts with spaces (90 % of them): a first-row cell without spaces votes *header*
  (``question`` above sentences);
* a standard column name (``text``, ``score``) votes *header*.

So ``Quality  #1 ID  #2 ID  #1 String  #2 String`` above ``1  1089874  1089925  ...`` is a header (three numeric
columns), and ``a cat,a dog,4.5`` above more scored pairs is data. A header naming columns embforge does not know
is an error unless a mapping says which columns to use: it is never read as a row.

A ``.csv`` file whose rows all split into the same number (> 1) of tab-separated cells, but not of commas, is read
as TSV (``atec_nlp_sim_train.csv``). TSV files quote nothing: a ``"`` is part of the text.
"""

from __future__ import annotations

import csv
import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from embforge.data.columns import (
    check_unique_targets,
    is_finite_number,
    is_position,
    named_sources,
    standard_name,
)
from embforge.files import DataError, read_lines

SAMPLE_ROWS = 200
Record = tuple[int, list[str]]
Row = tuple[int, dict[str, object]]


def delimited_rows(
    path: Path,
    mapping: dict[str, str],
    header: bool | None,
    delimiter: str,
    *,
    skip: Callable[[DataError], None] | None = None,
) -> Iterator[Row]:
    """``(line, {standard name: cell})`` for each data row of a CSV (``delimiter=","``) or TSV file.

    ``skip``, if given, is called with the error of a ragged row or an undecodable line (which is then left out)
    instead of raising it.
    """
    if delimiter == ",":
        delimiter = sniff_delimiter(path)
    records = _tsv_records(path, skip) if delimiter == "\t" else _csv_records(path, delimiter, skip)
    head: list[Record] = []  # the first row and the sample after it; blank lines at the start are not rows
    seen = 0
    for line, cells in records:
        if head or not _is_blank(cells):
            head.append((line, cells))
            seen += not _is_blank(cells)
        if seen > SAMPLE_ROWS:
            break
    if not head:
        return
    first_line, first = head[0]
    sample = [cells for _, cells in head[1:] if not _is_blank(cells)]
    has_header = _decide_header(path, first, sample, mapping, header)
    width = len(first)
    where = f"{path}:{first_line}:"
    names = header_names(first, mapping, where) if has_header else _positional_names(first, mapping, where)
    blank: int | None = None  # the first blank line since the last row (blank lines at the end are not rows)
    for line, cells in itertools.chain(head[1:] if has_header else head, records):
        if _is_blank(cells):
            blank = line if blank is None else blank
            continue
        if width == 1 and blank is not None:
            raise DataError(
                f"{path}:{blank}: column {names[0] or '0'!r}: empty text (a blank line in a one-column file is "
                "an empty row; remove it)"
            )
        blank = None
        if len(cells) != width:
            ragged = DataError(f"{path}:{line}: expected {width} columns, found {len(cells)} (ragged row)")
            if skip is None:
                raise ragged
            skip(ragged)
            continue
        yield line, {n: v for n, v in zip(names, cells) if n is not None}


def _is_blank(cells: list[str]) -> bool:
    return not cells or (len(cells) == 1 and not cells[0].strip())


def _decide_header(
    path: Path, first: list[str], rest: list[list[str]], mapping: dict[str, str], header: bool | None
) -> bool:
    named = named_sources(mapping)
    if header is False and named:
        raise ValueError(
            f"{path}: the column mapping names columns {', '.join(map(repr, named))} by name, which needs a "
            "header, but header=False (--no-header) says the file has none; use 0-based positions"
        )
    if header is not None:
        return header
    return bool(named) or looks_like_header(first, rest, mapping)


def looks_like_header(first: list[str], rest: list[list[str]], mapping: dict[str, str] | None = None) -> bool:
    """Whether ``first`` is a header above the rows ``rest`` (the module docstring gives the rule)."""
    cells = [c.strip() for c in first]
    names = set(named_sources(mapping or {}))
    known = [standard_name(c) is not None or c in names for c in cells]
    if all(known):
        return True
    votes = sum(known)
    body = [r for r in rest if len(r) == len(first)]
    for j, cell in enumerate(cells):
        column = [r[j].strip() for r in body]
        if not column:
            continue
        if all(is_finite_number(v) for v in column):
            votes += -1 if is_finite_number(cell) else 1
        elif len(column) >= 8 and len(set(column)) <= len(column) // 2:
            votes += -1 if cell in set(column) else 1
        elif len(column) >= 5 and not _spaced(cell) and sum(map(_spaced, column)) >= 0.9 * len(column):
            votes += 1
    return votes > 0


def _spaced(text: str) -> bool:
    return any(ch.isspace() for ch in text.strip())


def header_names(cells: list[str], mapping: dict[str, str], where: str) -> list[str | None]:
    """Standard names for a header's columns (``None``: not used), refusing unknown and duplicate names.

    With a ``mapping`` the columns it names take its names; the others keep their own if those are standard
    names the mapping does not give (as ``datasets``' ``rename_columns``), and other columns are left out.
    """
    names = [c.strip() for c in cells]
    keys = [standard_name(n) or n for n in names]
    resolved: dict[int, str] = {}
    if mapping:
        for source, target in mapping.items():
            index = _find_column(names, source)
            if index is None:
                raise DataError(
                    f"{where} the column mapping names {source!r}, which is not in the header (the header has: "
                    f"{', '.join(map(repr, names))})"
                )
            resolved[index] = target
        taken = set(resolved.values())  # a column the mapping renames takes the place of one with that name
        for i, key in enumerate(keys):
            if i not in resolved and standard_name(names[i]) and key not in taken:
                resolved[i] = key  # not named by the mapping: kept under its own (standard) name
    else:
        unknown = [n for n in names if standard_name(n) is None]
        if unknown:
            example = ",".join(f"{n}=..." for n in unknown[:2])
            raise DataError(
                f"{where} the header has columns embforge does not know: {', '.join(map(repr, unknown))}; say "
                f"which columns to use and what they are with --columns 'SOURCE=STANDARD,...' (e.g. --columns "
                f"'{example}'; standard names: sentence1, sentence2, score, anchor, positive, negative[_N], text, "
                "label; columns not named keep their standard names, others are left out), or pass --no-header if the "
                "first row is data"
            )
        resolved = {i: key for i, key in enumerate(keys)}
    for i in resolved:
        for j in range(len(keys)):
            if j != i and keys[j] == keys[i]:
                a, b = sorted((i, j))
                raise DataError(
                    f"{where} the header names column {keys[i]!r} twice (columns {a + 1} and {b + 1}); rename "
                    "one (the last one would silently win)"
                )
    check_unique_targets({names[i]: t for i, t in sorted(resolved.items())}, where)
    return [resolved.get(i) for i in range(len(names))]


def _find_column(names: list[str], source: str) -> int | None:
    if source in names:
        return names.index(source)
    folded = [i for i, n in enumerate(names) if n.casefold() == source.casefold()]
    if len(folded) == 1:
        return folded[0]
    if is_position(source) and int(source) < len(names):
        return int(source)
    return None


def _positional_names(first: list[str], mapping: dict[str, str], where: str) -> list[str | None]:
    width = len(first)
    if not mapping:
        return list(_guess_names(first))
    for source in mapping:
        if int(source) >= width:
            raise DataError(
                f"{where} the column mapping names column {source} but the rows have {width} columns "
                f"(0 to {width - 1})"
            )
    check_unique_targets({s: mapping[s] for s in sorted(mapping, key=int)}, where)
    return [mapping.get(str(i)) for i in range(width)]


def _guess_names(first: list[str]) -> list[str]:
    """Names for a headerless file without a mapping, from its width and first row."""
    if len(first) == 1:
        return ["text"]
    if len(first) == 2:
        return ["anchor", "positive"]
    if len(first) == 3 and is_finite_number(first[2]):
        return ["sentence1", "sentence2", "score"]
    return ["anchor", "positive"] + [f"negative_{i}" for i in range(1, len(first) - 1)]


def header_rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line, {header name: cell})`` for each row of a CSV/TSV file whose first row is a header (any names).

    Raises:
        DataError: for a duplicate header name, a ragged row, and what :func:`delimited_rows` refuses.
    """
    delimiter = sniff_delimiter(path) if path.suffix.lower() == ".csv" else "\t"
    records = _tsv_records(path) if delimiter == "\t" else _csv_records(path, delimiter)
    names: list[str] | None = None
    for line, cells in records:
        if _is_blank(cells):
            continue
        if names is None:
            names = [c.strip() for c in cells]
            for j, name in enumerate(names):
                if name in names[:j]:
                    raise DataError(
                        f"{path}:{line}: the header names column {name!r} twice (columns "
                        f"{names.index(name) + 1} and {j + 1}); rename one"
                    )
            continue
        if len(cells) != len(names):
            raise DataError(f"{path}:{line}: expected {len(names)} columns, found {len(cells)} (ragged row)")
        yield line, dict(zip(names, cells))


# ---------------------------------------------------------------------------------------------- records
def sniff_delimiter(path: Path, lines: int = 50) -> str:
    """``","`` unless the first lines split consistently on tabs but not on commas (a TSV named ``.csv``)."""
    sample: list[str] = []
    for _, text in read_lines(path, skip=lambda _: None):  # an undecodable line is the rows' reader's error
        if text.strip():
            sample.append(text)
        if len(sample) >= lines:
            break
    if not sample:
        return ","
    try:
        comma = {len(r) for r in csv.reader(sample[:-1] or sample)}
    except csv.Error:
        comma = set()
    tabs = {t.count("\t") + 1 for t in sample}
    if len(comma) == 1 and comma.pop() > 1:
        return ","
    if len(tabs) == 1 and tabs.pop() > 1:
        return "\t"
    return ","


def _tsv_records(path: Path, skip: Callable[[DataError], None] | None = None) -> Iterator[Record]:
    for line, text in read_lines(path, skip):
        body = text[:-1] if text.endswith("\n") else text
        body = body[:-1] if body.endswith("\r") else body
        if "\r" in body:  # TSV has no quoting: a bare \r is an old Mac line ending, not text
            raise DataError(
                f"{path}:{line}:{body.index(chr(13)) + 1}: carriage return inside a TSV line (old Mac line "
                "endings?); convert the file to \\n line endings"
            )
        yield line, ([] if not body.strip() else body.split("\t"))


def _csv_records(
    path: Path, delimiter: str, skip: Callable[[DataError], None] | None = None
) -> Iterator[Record]:
    csv.field_size_limit(max(csv.field_size_limit(), min(sys.maxsize, 2**31 - 1)))  # 10 MB texts are fine
    pending: list[tuple[int, str]] = []

    def lines() -> Iterator[str]:
        for number, text in read_lines(path, skip):
            pending.append((number, text))
            yield text

    reader = csv.reader(lines(), delimiter=delimiter, strict=True)
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            line, column, problem = _locate_csv_error(pending, delimiter)
            raise DataError(f"{path}:{line}:{column}: {problem or err}") from None
        start = pending[0][0] if pending else reader.line_num
        pending.clear()
        yield start, cells


def _locate_csv_error(lines: list[tuple[int, str]], delimiter: str) -> tuple[int, int, str | None]:
    """Where a CSV record went wrong: an unclosed quote, text after a closing quote, or a stray line break."""
    state, opened = "start", (lines[0][0] if lines else 1, 1)
    for number, text in lines:
        for i, ch in enumerate(text):
            at_end = text[i:] in ("\n", "\r\n", "\r")
            if state == "quoted":
                state = "closing" if ch == '"' else "quoted"
            elif state == "closing" and ch not in ('"', delimiter) and not at_end:
                return number, i + 1, f'unexpected {ch!r} after the closing quote of a field (quote it as "")'
            elif state == "closing":
                state = "quoted" if ch == '"' else "start"
            elif ch == delimiter or at_end:
                state = "start"
            elif ch in "\r\n":
                return number, i + 1, "line break inside an unquoted field (quote the field)"
            elif state == "start" and ch == '"':
                state, opened = "quoted", (number, i + 1)
            else:
                state = "plain"
    if state == "quoted":
        return opened[0], opened[1], "quoted field never closed"
    return (lines[0][0] if lines else 1), 1, None
