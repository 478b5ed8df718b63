"""Training rows read from local files and Hugging Face data sets, checked one by one as they are read.

:func:`file_rows` (CSV/TSV/JSONL/Parquet files, any number, each row checked as
:func:`~embforge.data.tables.read_table` checks it) and :func:`hub_rows` (a Hub data set, streamed) are the
generators ``datasets`` reads in the ``mmap`` and ``stream`` modes (:mod:`embforge.data.sources`). Each row carries
where it came from (``_line``, ``_file``); a bad row (invalid JSON, a ragged or undecodable line, an empty text ...)
is a record holding only its error (``_bad``, naming ``file:line``), so that the source reading it counts it in
the run's :class:`BadRows` where the training reaches it: ``--max-bad-rows`` bounds the bad rows of the whole run,
across its files and tasks, each counted once however often a stream is read again.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from embforge._optional import require
from embforge.data.columns import as_integer, standard_mapping
from embforge.data.delimited import delimited_rows, header_names
from embforge.data.tables import check_value, json_target
from embforge.files import DataError, read_lines

DATA_SUFFIXES = (".csv", ".tsv", ".txt", ".jsonl", ".json", ".parquet")
LINE, FILE = "_line", "_file"  # where each row came from (kept in the Arrow cache, for error messages)
BAD = "_bad"  # a bad row's error, in place of its columns: bad rows travel with the good ones to the run's count
RawRow = dict[str, object] | DataError  # a row as read, or why it is bad
SHOWN_BAD_ROWS = 5


# ------------------------------------------------------------------------------------------------ bad rows
@dataclass
class BadRows:
    """The run's ``--max-bad-rows`` policy and count: raise at the first bad row (``limit=0``) or skip up to
    ``limit`` of them, each counted once across every file and source of the run (a stream read again in a later
    epoch, or on a resume, meets the same rows again)."""

    limit: int = 0
    seen: set[str] = field(default_factory=set)  # the bad rows' messages (each names its file and line)

    @property
    def count(self) -> int:
        return len(self.seen)

    def skip(self, message: str) -> bool:
        """Count the bad row ``message`` describes, or raise it past the limit; whether it was new."""
        if message in self.seen:
            return False
        if self.count >= self.limit:
            raise over_limit(message, self.limit)
        self.seen.add(message)
        if self.count <= SHOWN_BAD_ROWS:
            print(f"skipped bad row {self.count}: {message}", file=sys.stderr)
        return True


def over_limit(message: str, limit: int) -> DataError:
    """The error of a bad row past ``--max-bad-rows``."""
    hint = "--max-bad-rows N skips up to N bad rows" if limit == 0 else "over --max-bad-rows"
    return DataError(f"{message} ({hint})")


def check_row(where: str, line: int, row: dict[str, object], expected: list[str] | None) -> dict[str, object]:
    """``row`` with each value checked as :func:`~embforge.data.tables.read_table` checks it.

    Labels must be integers here, ``"1"`` in a CSV cell included (class names need the whole file: read it in
    memory).
    """
    if expected is not None:
        for name in expected:
            if row.get(name) is None:
                raise DataError(f"{where}:{line}: column {name!r}: missing value")
        for name in row:
            if name not in expected:
                raise DataError(f"{where}:{line}: column {name!r}: not present in earlier rows")
    checked = {name: check_value(Path(where), line, name, value) for name, value in row.items()}
    label = checked.get("label")
    if isinstance(label, str) and as_integer(label) is not None:  # a CSV/TSV cell holds "1" as text
        checked["label"] = as_integer(label)
    elif isinstance(label, str):
        raise DataError(
            f"{where}:{line}: column 'label': {checked['label']!r} is a class name; a streamed or memory-mapped "
            "file needs integer labels (or read it with --data-mode memory)"
        )
    return checked


@dataclass
class RowChecker:
    """Rows checked by :func:`check_row` as they are read; every row must have the columns of the first good one
    (across all the rows read through one checker). A bad row is passed on as its error, for the run's
    :class:`BadRows` to count where the training reaches it."""

    expected: list[str] | None = None

    def rows(self, where: str, rows: Iterable[tuple[int, RawRow]]) -> Iterator[tuple[int, RawRow]]:
        """``(line, checked row or its error)`` of ``rows`` (rows already bad when read stay as they are)."""
        for line, row in rows:
            if isinstance(row, DataError):
                yield line, row
                continue
            try:
                checked = check_row(where, line, row, self.expected)
            except DataError as err:
                yield line, err
                continue
            self.expected = self.expected or list(checked)
            yield line, checked


def _records(
    rows: Iterable[tuple[int, RawRow]], number: int, max_bad_rows: int
) -> Iterator[dict[str, object]]:
    """The records of checked ``rows`` of file ``number``: a bad row is ``{BAD: its error}`` (the other columns
    left out); more than ``max_bad_rows`` bad rows in these alone are over the run's limit too."""
    bad = 0
    for line, row in rows:
        if isinstance(row, DataError):
            bad += 1
            if bad > max_bad_rows:
                raise over_limit(str(row), max_bad_rows)
            yield {LINE: line, FILE: number, BAD: str(row)}
        else:
            yield {**row, LINE: line, FILE: number}


# ------------------------------------------------------------------------------------------------ file rows
def data_files(path: str | os.PathLike) -> list[Path]:
    """The data files of ``path``: the file itself, or a folder's data files (any depth) in name order."""
    root = Path(path)
    if root.is_file():
        return [root]
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in DATA_SUFFIXES)
    if not files:
        raise DataError(f"{root}: no data files ({', '.join(DATA_SUFFIXES)}) in this folder")
    return files


def file_rows(
    files: list[str],
    numbers: list[int],
    columns: str | dict[str, str] | None,
    header: bool | None,
    max_bad_rows: int,
    stamps: list[tuple[int, int]],
) -> Iterator[dict[str, object]]:
    """Checked rows of ``files`` (``numbers``: each file's index, kept in the rows' ``_file`` column), bad rows as
    ``{"_bad": error}`` records (:func:`_records`).

    A ``datasets`` generator: its arguments (``stamps``: each file's size and modification time) make the
    Arrow cache's fingerprint, so an edited file is converted again. Lists are split across shards.
    """
    mapping = standard_mapping(columns)
    check = RowChecker()
    for name, number in zip(files, numbers):
        yield from _records(check.rows(name, _raw_rows(Path(name), mapping, header)), number, max_bad_rows)


def _raw_rows(path: Path, mapping: dict[str, str], header: bool | None) -> Iterator[tuple[int, RawRow]]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        yield from _jsonl_rows(path, mapping)
    elif suffix == ".parquet":
        yield from _parquet_rows(path, mapping)
    else:  # the rows of a CSV/TSV file, with the ragged or undecodable lines found before each
        errors: list[DataError] = []
        delimiter = "," if suffix == ".csv" else "\t"
        for line, row in delimited_rows(path, mapping, header, delimiter, skip=errors.append):
            yield from ((0, err) for err in errors)
            errors.clear()
            yield line, row
        yield from ((0, err) for err in errors)


def _jsonl_rows(path: Path, mapping: dict[str, str]) -> Iterator[tuple[int, RawRow]]:
    errors: list[DataError] = []
    for line, text in read_lines(path, skip=errors.append):
        yield from ((0, err) for err in errors)
        errors.clear()
        if not text.strip():
            continue
        try:
            record = json.loads(text)
            if not isinstance(record, dict):
                raise DataError(f"{path}:{line}:1: expected a JSON object, found {type(record).__name__}")
        except json.JSONDecodeError as err:
            yield line, DataError(f"{path}:{line}:{err.colno}: invalid JSON ({err.msg})")
            continue
        except DataError as err:
            yield line, err
            continue
        keys = list(record)
        row: dict[str, object] = {}
        for i, key in enumerate(keys):
            target = json_target(key, i, keys, mapping)
            if target is not None:
                row[target] = record[key]
            elif not mapping:
                raise DataError(
                    f"{path}:{line}: key {key!r} is not a column embforge knows; map it with --columns"
                )
        yield line, row
    yield from ((0, err) for err in errors)


def _parquet_rows(path: Path, mapping: dict[str, str]) -> Iterator[tuple[int, RawRow]]:
    parquet = require("pyarrow.parquet").ParquetFile(path)
    names = header_names([str(n) for n in parquet.schema_arrow.names], mapping, f"{path}:")
    keep = [i for i, n in enumerate(names) if n is not None]
    line = 0
    for batch in parquet.iter_batches(batch_size=4096, columns=[parquet.schema_arrow.names[i] for i in keep]):
        values = [batch.column(j).to_pylist() for j in range(len(keep))]
        for row in zip(*values):
            line += 1
            yield line, {str(names[i]): value for i, value in zip(keep, row)}


def hub_rows(
    name: str, split: str, columns: str | dict[str, str] | None, max_bad_rows: int
) -> Iterator[dict[str, object]]:
    """Checked rows of a Hugging Face data set (a Hub id, or a folder ``load_dataset`` reads), streamed.

    The Hub cache and ``HF_DATASETS_OFFLINE=1`` apply; the "line" of a row is its 1-based number in the split.
    """
    stream = require("datasets").load_dataset(name, split=split, streaming=True)
    rows = RowChecker().rows(name, _record_rows(stream, standard_mapping(columns), name))
    yield from _records(rows, 0, max_bad_rows)


def _record_rows(
    records: Iterable[Mapping[str, object]], mapping: dict[str, str], where: str
) -> Iterator[tuple[int, RawRow]]:
    """``(line, row)`` of records (a Hub split's), their keys mapped to standard names as the first one's."""
    names: list[str | None] | None = None
    for line, record in enumerate(records, start=1):
        if names is None:
            names = header_names(list(record), mapping, f"{where}:")
        yield line, {str(n): v for n, v in zip(names, record.values()) if n is not None}
