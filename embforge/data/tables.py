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
are header names or 0-based column positions. Every problem names the file, the line and the column.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TEXT_ORDER = ("sentence1", "sentence2", "anchor", "positive", "text")
LABEL_NAMES = ("score", "label")
_NEGATIVE = re.compile(r"^negative(_\d+)?$")


class DataError(ValueError):
    """A problem in an input file; the message starts with ``file:line:``."""


def is_text_column(name: str) -> bool:
    return name in TEXT_ORDER or bool(_NEGATIVE.match(name))


def _column_rank(name: str) -> tuple[int, int]:
    if name in TEXT_ORDER:
        return (TEXT_ORDER.index(name), 0)
    match = _NEGATIVE.match(name)
    assert match is not None
    return (len(TEXT_ORDER), int(match.group(1)[1:]) if match.group(1) else 0)


@dataclass
class Dataset:
    """Rows of one file as named columns. Text columns hold strings; ``score`` floats; ``label`` ints."""

    path: str
    columns: dict[str, list] = field(default_factory=dict)
    lines: list[int] = field(default_factory=list)
    label_names: list[str] | None = None

    def __len__(self) -> int:
        return len(self.lines)

    @property
    def text_columns(self) -> list[str]:
        """Text column names in their canonical order (``sentence1, sentence2`` / ``anchor, positive, negative…``)."""
        return sorted((c for c in self.columns if is_text_column(c)), key=_column_rank)

    @property
    def label_column(self) -> str | None:
        return next((c for c in LABEL_NAMES if c in self.columns), None)

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
                any(_NEGATIVE.match(c) for c in self.columns) if name == "negative*" else name in self.columns
            )
            if not present:
                raise DataError(
                    f"{self.path}:1: missing column {name!r} needed by {purpose}; the file has "
                    f"{', '.join(self.columns) or 'no columns'} (map other names with --columns)"
                )

    def subset(self, indices: Sequence[int]) -> Dataset:
        return Dataset(
            self.path,
            {name: [values[i] for i in indices] for name, values in self.columns.items()},
            [self.lines[i] for i in indices],
            self.label_names,
        )


def parse_columns(spec: str | dict[str, str] | None) -> dict[str, str]:
    """Parse ``"a=sentence1,b=sentence2"`` (or a dict) into a mapping; keys are header names or positions."""
    if spec is None:
        return {}
    if isinstance(spec, dict):
        return {str(k): v for k, v in spec.items()}
    mapping = {}
    for item in spec.split(","):
        if "=" not in item:
            raise ValueError(f"--columns item {item!r} must look like SOURCE=STANDARD (e.g. 0=sentence1)")
        source, target = item.split("=", 1)
        mapping[source.strip()] = target.strip()
    return mapping


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
        path: ``.csv``, ``.tsv``/``.txt`` (tab-separated), ``.jsonl``/``.json`` or ``.parquet``.
        columns: Mapping from source column (header name or 0-based position) to standard name.
        header: Whether a CSV/TSV file has a header row; ``None`` detects it (a first row made of known names).
        label_set: Allowed integer labels; any other label is an error naming its line.
        label_names: Fixed order for string labels (they become their index); else sorted order.

    Raises:
        DataError: For empty texts, non-numeric or NaN scores, missing columns and ragged rows, naming
            file, line and column.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    mapping = parse_columns(columns)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(path, mapping)
    elif suffix == ".parquet":
        rows = _parquet_rows(path, mapping)
    else:
        rows = _delimited_rows(path, mapping, header, "," if suffix == ".csv" else "\t")
    return _validate(path, rows, label_set, label_names)


Row = tuple[int, dict[str, str | float | int | None]]


def _standard(name: str, mapping: dict[str, str], position: int) -> str | None:
    """The standard name of a source column, or ``None`` for columns embforge does not use."""
    target = mapping.get(name, mapping.get(str(position)))
    if target is None and not mapping:
        target = name
    if target is None:
        return None
    if not (is_text_column(target) or target in LABEL_NAMES):
        raise ValueError(
            f"unknown standard column {target!r}; use sentence1, sentence2, score, anchor, positive, "
            "negative[_N], text or label"
        )
    return target


def _guess_names(first: list[str]) -> list[str]:
    """Names for a headerless file without a mapping, from its width and first row."""
    if len(first) == 2:
        return ["anchor", "positive"]
    if len(first) == 3 and _is_number(first[2]):
        return ["sentence1", "sentence2", "score"]
    return ["anchor", "positive"] + [f"negative_{i}" for i in range(1, len(first) - 1)]


def _delimited_rows(
    path: Path, mapping: dict[str, str], header: bool | None, delimiter: str
) -> Iterator[Row]:
    with path.open(newline="", encoding="utf-8-sig") as handle:
        if delimiter == ",":
            reader = csv.reader(handle, delimiter=delimiter)
        else:  # TSV files quote nothing: a '"' inside a text is part of the text
            reader = csv.reader(handle, delimiter=delimiter, quoting=csv.QUOTE_NONE)
        start = 1
        names: list[str | None] | None = None
        width = 0
        for record in reader:
            line, start = start, reader.line_num + 1
            if not record or (len(record) == 1 and not record[0].strip()):
                continue
            if names is None:
                width = len(record)
                has_header = header
                if has_header is None:
                    known = {*mapping, *TEXT_ORDER, *LABEL_NAMES}
                    has_header = all(c.strip() in known or bool(_NEGATIVE.match(c.strip())) for c in record)
                if has_header:
                    names = [_standard(c.strip(), mapping, i) for i, c in enumerate(record)]
                    continue
                source = mapping or dict(zip(map(str, range(width)), _guess_names(record)))
                names = [_standard(str(i), source, i) for i in range(width)]
            if len(record) != width:
                raise DataError(f"{path}:{line}: expected {width} columns, found {len(record)} (ragged row)")
            yield line, {n: v for n, v in zip(names, record) if n is not None}


def _jsonl_rows(path: Path, mapping: dict[str, str]) -> Iterator[Row]:
    with path.open(encoding="utf-8-sig") as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{line}: column {err.colno}: invalid JSON ({err.msg})") from err
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{line}: expected a JSON object, found {type(obj).__name__}")
            row = {}
            for i, (key, value) in enumerate(obj.items()):
                name = _standard(key, mapping, i)
                if name is not None:
                    row[name] = value
            yield line, row


def _parquet_rows(path: Path, mapping: dict[str, str]) -> Iterator[Row]:
    from embforge._optional import require

    table = require("pyarrow.parquet").read_table(path)
    names = [_standard(c, mapping, i) for i, c in enumerate(table.column_names)]
    for line, record in enumerate(table.to_pylist(), start=1):
        yield line, {n: v for n, v in zip(names, record.values()) if n is not None}


def _is_number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def _validate(
    path: Path, rows: Iterator[Row], label_set: Sequence[int] | None, label_names: Sequence[str] | None
) -> Dataset:
    data = Dataset(str(path))
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
            data.columns[name].append(_check_value(path, line, name, value))
        data.lines.append(line)
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


def _check_value(path: Path, line: int, name: str, value: object) -> object:
    if name == "score":
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise DataError(f"{path}:{line}: column 'score': {value!r} is not a number") from None
        if not math.isfinite(number):
            raise DataError(f"{path}:{line}: column 'score': {value!r} is not a finite number")
        return number
    if name == "label":
        if isinstance(value, float) and not math.isfinite(value):
            raise DataError(f"{path}:{line}: column 'label': {value!r} is not a valid label")
        if isinstance(value, str) and not value.strip():
            raise DataError(f"{path}:{line}: column 'label': empty label")
        return value
    if not isinstance(value, str):
        raise DataError(f"{path}:{line}: column {name!r}: expected text, found {type(value).__name__}")
    if not value.strip():
        raise DataError(f"{path}:{line}: column {name!r}: empty text")
    return value


def _encode_labels(data: Dataset, label_names: Sequence[str] | None) -> tuple[list[int], list[str] | None]:
    """Integer labels stay integers; string labels become indices into ``label_names`` (given or sorted)."""
    raw = data.columns["label"]
    if all(_is_integral(v) for v in raw):
        return [int(float(v)) for v in raw], None
    names = list(label_names) if label_names is not None else sorted({str(v) for v in raw})
    index = {name: i for i, name in enumerate(names)}
    encoded = []
    for line, value in zip(data.lines, raw):
        if str(value) not in index:
            raise DataError(f"{data.path}:{line}: column 'label': {value!r} is not one of {names}")
        encoded.append(index[str(value)])
    return encoded, names


def _is_integral(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number.is_integer()
