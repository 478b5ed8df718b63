"""Reading CSV/TSV/JSONL/Parquet files into named, validated columns.

Standard column names:

==========================================  ==============================================
columns                                     meaning
==========================================  ==============================================
``sentence1, sentence2, score``             scored pairs (STS, pair classification)
``anchor, positive[, negative, ...]``       pairs / triplets; any number of negative columns
``text, label``                             classification / clustering
==========================================  ==============================================

Files with other names, or without a header, take a ``columns`` mapping ``{"source": "standard"}`` whose keys
are header names or 0-based column positions; it renames those and keeps the file's other standard columns
(as ``datasets``' ``rename_columns``). Every problem names the file, the line and the column.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embforge._optional import require
from embforge.data.columns import (
    LABEL_NAMES,
    NEGATIVE,
    STANDARD_HELP,
    TEXT_ORDER,
    NamedColumns,
    as_integer,
    is_text_column,
    parse_columns,
    parse_number,
    standard_mapping,
    standard_name,
)
from embforge.data.delimited import Row, delimited_rows, header_names
from embforge.data.texts import ControlCharacters, is_blank
from embforge.files import DataError, read_jsonl

__all__ = [
    "LABEL_NAMES",
    "TEXT_ORDER",
    "DataError",
    "Dataset",
    "is_text_column",
    "parse_columns",
    "read_table",
]


@dataclass
class Dataset(NamedColumns):
    """Rows of one file as named columns. Text columns hold strings; ``score`` floats; ``label`` ints."""

    path: str
    columns: dict[str, list] = field(default_factory=dict)
    lines: list[int] = field(default_factory=list)
    label_names: list[str] | None = None

    def __len__(self) -> int:
        return len(self.lines)

    def texts(self) -> list[list[str]]:
        return [self.columns[c] for c in self.text_columns]

    def labels(self) -> np.ndarray | None:
        name = self.label_column
        if name is None:
            return None
        return np.asarray(self.columns[name], dtype=np.float32 if name == "score" else np.int64)

    def require(self, names: Sequence[str], *, purpose: str) -> None:
        """Fail unless every column in ``names`` is present (``negative*`` means at least one negative)."""
        for name in names:
            present = (
                any(NEGATIVE.match(c) for c in self.columns) if name == "negative*" else name in self.columns
            )
            if not present:
                raise DataError(
                    f"{self.path}:1: missing column {name!r} needed by {purpose}; the file has "
                    f"{', '.join(self.columns) or 'no columns'} (map other names with --columns)"
                )

    @property
    def num_rows(self) -> int:
        return len(self.lines)

    def take(self, positions: Sequence[int]) -> dict[str, list]:
        """``{column: values}`` of the rows at ``positions`` (the row-source contract, ``data/sources.py``)."""
        return {name: [values[i] for i in positions] for name, values in self.columns.items()}

    def rows(self, start: int, end: int) -> dict[str, list]:
        """``{column: values}`` of rows ``start..end``."""
        return {name: values[start:end] for name, values in self.columns.items()}

    def subset(self, indices: Sequence[int]) -> Dataset:
        return Dataset(
            self.path,
            {name: [values[i] for i in indices] for name, values in self.columns.items()},
            [self.lines[i] for i in indices],
            self.label_names,
        )


def read_table(
    path: str | os.PathLike,
    *,
    columns: str | dict[str, str] | None = None,
    header: bool | None = None,
    label_set: Sequence[int] | None = None,
    label_names: Sequence[str] | None = None,
) -> Dataset:
    """Read a CSV, TSV, JSONL or Parquet file into a validated :class:`Dataset`.

    Args:
        path: ``.csv``, ``.tsv``/``.txt``/other (tab-separated), ``.jsonl``/``.json`` (one object per line) or
            ``.parquet``.
        columns: Mapping from source column (header name, JSON key or 0-based position) to standard name, as a
            dict or ``"Quality=label,#1 String=sentence1"``. Columns it does not name keep their standard names
            (one whose name a mapped column takes is left out); columns with other names are left out.
        header: Whether a CSV/TSV file has a header row; ``None`` detects it from the content (see
            :mod:`embforge.data.delimited`); a mapping that names columns implies one.
        label_set: Allowed integer labels; any other label is an error naming its line.
        label_names: Fixed order for string labels (they become their index); else sorted order.

    Raises:
        DataError: ``file:line:`` (and ``column`` where known) for invalid UTF-8, broken quoting or JSON,
            unknown or duplicate columns, empty texts, non-numeric or non-finite scores, labels that are not
            labels, ragged rows and a file without rows. For Parquet the number is the row's (1-based).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    mapping = standard_mapping(columns)
    suffix = path.suffix.lower()
    rows: Iterator[Row]
    if suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(path, mapping)
    elif suffix == ".parquet":
        rows = _parquet_rows(path, mapping)
    else:
        rows = delimited_rows(path, mapping, header, "," if suffix == ".csv" else "\t")
    return _validate(path, rows, label_set, label_names)


def _jsonl_rows(path: Path, mapping: dict[str, str]) -> Iterator[Row]:
    for line, record in read_jsonl(path):
        row: dict[str, object] = {}
        source: dict[str, str] = {}
        keys = list(record)
        for i, key in enumerate(keys):
            target = json_target(key, i, keys, mapping)
            if target is None:
                if not mapping:
                    raise DataError(
                        f"{path}:{line}: key {key!r} is not a column embforge knows; say which keys to use with "
                        f"--columns (e.g. --columns '{key}=text,...'; standard names: {STANDARD_HELP})"
                    )
                continue
            if target in row:
                raise DataError(
                    f"{path}:{line}: keys {source[target]!r} and {key!r} both map to {target!r}; keep one"
                )
            row[target], source[target] = record[key], key
        yield line, row


def json_target(key: str, position: int, keys: list[str], mapping: dict[str, str]) -> str | None:
    """The column a JSON object's ``key`` (at ``position`` among ``keys``) fills: the one ``mapping`` gives it,
    else its standard name unless the mapping gives that name to another key; ``None``: left out."""
    if not mapping:
        return standard_name(key)
    if key in mapping:
        return mapping[key]
    folded = [k for k in mapping if k.casefold() == key.casefold() and k not in keys]
    if len(folded) == 1:
        return mapping[folded[0]]
    if str(position) in mapping:
        return mapping[str(position)]
    own = standard_name(key)
    return own if own not in mapping.values() else None


def _parquet_rows(path: Path, mapping: dict[str, str]) -> Iterator[Row]:
    pq = require("pyarrow.parquet")
    errors = (require("pyarrow").lib.ArrowException, OSError, ValueError, TypeError, IndexError)
    try:
        parquet = pq.ParquetFile(path)
        columns = [str(c) for c in parquet.schema_arrow.names]
    except errors as err:
        raise DataError(f"{path}: not a readable Parquet file ({err})") from None
    names = header_names(columns, mapping, f"{path}:")
    try:
        table = parquet.read()
        values = {str(names[i]): table.column(i).to_pylist() for i, n in enumerate(names) if n is not None}
    except errors as err:
        raise DataError(f"{path}: not a readable Parquet file ({err})") from None
    for row in range(table.num_rows):
        yield row + 1, {name: column[row] for name, column in values.items()}


def _validate(
    path: Path, rows: Iterator[Row], label_set: Sequence[int] | None, label_names: Sequence[str] | None
) -> Dataset:
    data = Dataset(str(path))
    controls = ControlCharacters(path)  # removed, counted, one notice per file (data/texts.py)
    expected: list[str] | None = None
    for line, row in rows:
        if expected is None:
            expected = list(row)
            data.columns = {name: [] for name in expected}
        for name in expected:
            if name not in row or row[name] is None:
                raise DataError(f"{path}:{line}: column {name!r}: missing value")
        for name, value in row.items():
            if name not in data.columns:
                raise DataError(f"{path}:{line}: column {name!r}: not present in earlier rows")
            data.columns[name].append(check_value(path, line, name, value, controls))
        data.lines.append(line)
    controls.warn()
    if not data.lines:
        raise DataError(f"{path}:1: the file has no data rows")
    if "label" in data.columns:
        data.columns["label"], data.label_names = _encode_labels(data, label_names)
        if label_set is not None:
            allowed = set(label_set)
            for line, value in zip(data.lines, data.columns["label"]):
                if value not in allowed:
                    raise DataError(
                        f"{path}:{line}: column 'label': {value} is not one of the allowed labels {sorted(allowed)}"
                    )
    return data


def check_value(
    path: Path, line: int, name: str, value: object, controls: ControlCharacters | None = None
) -> object:
    """``value`` of column ``name`` as a row holds it, or a :class:`DataError` naming ``path:line`` and the column."""
    if name == "score" and isinstance(value, list):  # one teacher score per candidate (`embforge score`)
        if not value or any(isinstance(v, list) for v in value):
            raise DataError(
                f"{path}:{line}: column 'score': a list of scores must hold numbers, got {value!r}"
            )
        return [check_value(path, line, name, v) for v in value]
    if name == "score":
        number = parse_number(value)
        if number is None:
            kind = " (a boolean)" if isinstance(value, bool) else ""
            raise DataError(f"{path}:{line}: column 'score': {value!r} is not a number{kind}")
        if not math.isfinite(number):
            raise DataError(f"{path}:{line}: column 'score': {value!r} is not a finite number")
        return number
    if name == "label":
        if isinstance(value, str):
            if not value.strip():
                raise DataError(f"{path}:{line}: column 'label': empty label")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or as_integer(value) is None:
            raise DataError(
                f"{path}:{line}: column 'label': {value!r} is not a valid label (an integer or a class name)"
            )
        return as_integer(value)
    if not isinstance(value, str):
        raise DataError(f"{path}:{line}: column {name!r}: expected text, found {type(value).__name__}")
    if controls is not None:
        value = controls.clean(value, line=line, column=name)
    if is_blank(value):
        raise DataError(
            f"{path}:{line}: column {name!r}: empty text (only whitespace or invisible characters)"
        )
    return value


def _encode_labels(data: Dataset, label_names: Sequence[str] | None) -> tuple[list[int], list[str] | None]:
    """Integer labels stay integers; class names become indices into ``label_names`` (given or sorted).

    A column of integers with a few words among them (``1_0``, a header read as a row) is an error at the first
    word, and so is the reverse: the minority kind is the mistake.
    """
    raw: list[object] = data.columns["label"]
    ints = [as_integer(v) for v in raw]
    numeric = sum(x is not None for x in ints)
    if numeric == len(raw):
        return [int(x) for x in ints if x is not None], None
    if numeric * 2 >= len(raw):
        first = next(i for i, x in enumerate(ints) if x is None)
        example = next(i for i, x in enumerate(ints) if x is not None)
        raise DataError(
            f"{data.path}:{data.lines[first]}: column 'label': {raw[first]!r} is not an integer like the other "
            f"labels (line {data.lines[example]}: {raw[example]!r})"
        )
    names = list(label_names) if label_names is not None else sorted({str(v) for v in raw})
    index = {name: i for i, name in enumerate(names)}
    encoded = []
    for line, value in zip(data.lines, raw):
        if str(value) not in index:
            raise DataError(f"{data.path}:{line}: column 'label': {value!r} is not one of {names}")
        encoded.append(index[str(value)])
    return encoded, names
