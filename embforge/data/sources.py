"""Training rows from files too large for memory: a memory-mapped Arrow cache or a stream, read by position.

A *row source* gives a task's rows by position (:class:`RowSource`): ``take(positions)`` and ``rows(start, end)``
return ``{column: values}`` for those rows. Three kinds share that contract:

=========== ================================================================ ===================================
mode        what is read                                                     memory, time before the first step
=========== ================================================================ ===================================
``memory``  :func:`~embforge.data.tables.read_table`: the whole file, checked  O(rows)
``mmap``    Hugging Face ``datasets`` Arrow cache, written once, memory-mapped  O(1) once the cache exists
``stream``  a ``datasets`` ``IterableDataset``, read a window at a time        O(window)
=========== ================================================================ ===================================

Local CSV/TSV/JSONL/Parquet files and folders of them are read by embforge's own readers (header detection,
column mapping, ``file:line:column`` errors) and checked row by row as the data is reached
(:func:`file_rows`); a name that is not a local path is a Hugging Face Hub data set (``datasets.load_dataset``
with ``streaming=True``: the Hub cache and ``HF_DATASETS_OFFLINE`` apply). A bad row stops the run with its
file and line unless ``max_bad_rows`` > 0, which skips up to that many in the whole run (every file of every
source opened with one :class:`SourceOptions`, each bad row counted once however often a stream is read; the first
few printed). A line that is not UTF-8 is a bad row like the others.

A stream has no random access: it is read a window of ``window`` rows at a time (the training plan shuffles
inside each window, :mod:`embforge.training.sampling`); a position before the buffered window re-opens the
stream. ``datasets`` is imported only when a non-memory source is opened.

Under torchrun every rank opens the same source and plans the same batches (the plan decides each step's task,
its rows and their distinct texts, and must agree on every rank); each rank then fetches and embeds only its part
of a batch (:func:`embforge.training.distributed.rank_rows`). ``datasets.distributed.split_dataset_by_node`` is
not used: it would give each rank its own rows to plan from, so a global batch would no longer be the one-process
batch (the two-process run would stop equalling one process, bit for bit, and resuming would depend on the number
of ranks), and when the number of files is not a multiple of the ranks it still has every rank read every row.
Reading is not what limits a rank: the read-plan-tokenise path runs ~150x faster than a MiniLM step.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from embforge._optional import require
from embforge.data.columns import NamedColumns, standard_mapping
from embforge.data.delimited import decoded_lines, delimited_rows, header_names
from embforge.data.tables import Dataset, check_value, json_target, read_table
from embforge.files import DataError

if TYPE_CHECKING:
    import datasets

MODES = ("memory", "mmap", "stream")
DATA_SUFFIXES = (".csv", ".tsv", ".txt", ".jsonl", ".json", ".parquet")
LINE, FILE = "_line", "_file"  # where each row came from (kept in the Arrow cache, for error messages)
BAD = "_bad"  # a bad row's error, in place of its columns: bad rows travel with the good ones to the run's count
RawRow = dict[str, object] | DataError  # a row as read, or why it is bad
SHOWN_BAD_ROWS = 5
# rows per Arrow record batch in the cache: opening the cache touches each batch's first pages, and the kernel maps
# up to 64 KB of cached file around each touch, so 1,000-row batches (datasets' default) put ~65 MB per million rows
# of file pages into the process's RSS; 100,000-row batches, under 1 MB
ARROW_BATCH_ROWS = 100_000


@runtime_checkable
class RowSource(Protocol):
    """A task's rows by position. :class:`~embforge.data.tables.Dataset` (in memory) is one."""

    path: str

    @property
    def columns(self) -> Collection[str]: ...

    @property
    def text_columns(self) -> list[str]: ...

    @property
    def label_column(self) -> str | None: ...

    @property
    def num_rows(self) -> int | None:
        """Rows in the source (``None``: a stream of unknown length)."""

    def take(self, positions: Sequence[int]) -> dict[str, list]:
        """``{column: values}`` of the rows at ``positions``, in that order."""

    def rows(self, start: int, end: int) -> dict[str, list]:
        """``{column: values}`` of rows ``start..end`` (fewer at the end of the source)."""


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

    Labels must be integers here (class names need the whole file: read it in memory).
    """
    if expected is not None:
        for name in expected:
            if row.get(name) is None:
                raise DataError(f"{where}:{line}: column {name!r}: missing value")
        for name in row:
            if name not in expected:
                raise DataError(f"{where}:{line}: column {name!r}: not present in earlier rows")
    checked = {name: check_value(Path(where), line, name, value) for name, value in row.items()}
    if isinstance(checked.get("label"), str):
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
    for line, text in decoded_lines(path, skip=errors.append):
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


# ---------------------------------------------------------------------------------------------- the sources
class ArrowSource(NamedColumns):
    """Rows of a memory-mapped ``datasets.Dataset`` (random access without reading the rest).

    The bad rows of the files are in the table too (their ``_bad`` column holds the error, null for a good row),
    counted by the run's ``bad`` policy when the source opens; positions then skip them (8 bytes per row).
    """

    def __init__(self, table: datasets.Dataset, *, path: str, bad: BadRows | None = None) -> None:
        self.table = table
        self.path = path
        self.columns = [c for c in table.column_names if not c.startswith("_")]
        self.good: np.ndarray | None = None  # positions of the good rows, when some are bad
        errors = table.data.column(BAD) if BAD in table.column_names else None
        if errors is not None and errors.null_count < len(errors):  # null counts: no data read
            is_bad = require("pyarrow.compute").is_valid(errors)
            messages = errors.filter(is_bad).to_pylist()
            for message in messages:
                (bad or BadRows()).skip(message)
            print(f"skipped {len(messages)} bad row(s) in {path}", file=sys.stderr)
            self.good = np.flatnonzero(~is_bad.to_numpy(zero_copy_only=False))

    @property
    def num_rows(self) -> int:
        return len(self.table) if self.good is None else len(self.good)

    def take(self, positions: Sequence[int]) -> dict[str, list]:
        return self.table[self._rows(positions)]

    def rows(self, start: int, end: int) -> dict[str, list]:
        return self.table[start:end] if self.good is None else self.table[self.good[start:end].tolist()]

    def _rows(self, positions: Sequence[int]) -> list[int]:
        return list(positions) if self.good is None else self.good[list(positions)].tolist()


class StreamSource(NamedColumns):
    """Rows of an iterable (a ``datasets.IterableDataset``), buffered a window of ``window`` rows at a time.

    ``take`` and ``rows`` must stay inside one window (the plan cuts batches inside windows); a window
    before the buffered one re-reads the stream from its start. Bad rows (``{"_bad": error}`` records) are left
    out where the stream reaches them, counted by the run's ``bad`` policy.
    """

    def __init__(
        self,
        stream: Iterable[Mapping[str, object]],
        *,
        path: str,
        window: int,
        num_rows: int | None = None,
        bad: BadRows | None = None,
    ):
        self.stream, self.path, self.window = stream, path, window
        self.bad = bad or BadRows()
        self.skipped = 0  # bad rows of this source
        self._num_rows = num_rows
        first = next(self._good(iter(stream)), None)
        if first is None:
            raise DataError(f"{path}:1: the data has no rows")
        self.columns = [c for c in first if not c.startswith("_")]
        self._iter: Iterator[Mapping[str, object]] | None = None
        self._read = 0  # rows taken from self._iter
        self._start = -1  # first position of the buffered window
        self._buffer: dict[str, list] = {}
        self.windows_read = 0

    @property
    def num_rows(self) -> int | None:
        return self._num_rows

    def rows(self, start: int, end: int) -> dict[str, list]:
        base = self._load(start)
        return {name: values[start - base : end - base] for name, values in self._buffer.items()}

    def take(self, positions: Sequence[int]) -> dict[str, list]:
        base = self._load(min(positions))
        if max(positions) - base >= len(self._buffer[LINE]):
            raise IndexError(f"{self.path}: positions {min(positions)}..{max(positions)} span two windows")
        return {name: [values[p - base] for p in positions] for name, values in self._buffer.items()}

    def _good(self, records: Iterator[Mapping[str, object]]) -> Iterator[Mapping[str, object]]:
        """The good rows of ``records``, the bad ones counted (or raised past the run's limit)."""
        for record in records:
            message = record.get(BAD)
            if message is None:
                yield record
            elif self.bad.skip(str(message)):
                self.skipped += 1

    def _load(self, position: int) -> int:
        """Buffer the window holding ``position``; returns its first position."""
        start = position - position % self.window
        if start == self._start:
            return start
        if self._iter is None or start < self._read:
            self._iter, self._read = self._good(iter(self.stream)), 0
        skipped = sum(1 for _ in itertools.islice(self._iter, start - self._read))
        self._read += skipped
        records = list(itertools.islice(self._iter, self.window))
        self._read += len(records)
        self._buffer = {name: [r[name] for r in records] for name in (records[0] if records else {LINE: 0})}
        self._start = start
        self.windows_read += 1
        if len(records) < self.window and self._num_rows is None:
            self._num_rows = start + len(records)
            if self.skipped:
                print(f"skipped {self.skipped} bad row(s) in {self.path}", file=sys.stderr)
        return start


# -------------------------------------------------------------------------------------------------- opening
@dataclass
class SourceOptions:
    """How a training file or data set is read (``RunSpec`` fields ``data_mode`` ... ``data_split``)."""

    mode: str = "memory"
    columns: str | dict[str, str] | None = None
    header: bool | None = None
    max_bad_rows: int = 0
    window: int = 10_000  # stream: rows buffered (and shuffled) at a time
    cache_dir: str | None = None  # mmap: where datasets writes its Arrow cache (default: HF_DATASETS_CACHE)
    split: str = "train"  # Hub data sets
    tally: BadRows | None = field(default=None, repr=False, compare=False)

    def bad_rows(self) -> BadRows:
        """The run's count of bad rows: one for every source opened with these options (a run opens all its
        training files with one), so ``max_bad_rows`` bounds the bad rows of the whole run."""
        if self.tally is None:
            self.tally = BadRows(self.max_bad_rows)
        return self.tally


def open_source(name: str | os.PathLike, options: SourceOptions) -> Dataset | RowSource:
    """The rows of ``name`` (a file, a folder of data files, or a Hub data set id) read as ``options.mode``."""
    if options.mode not in MODES:
        raise ValueError(f"data mode must be one of {', '.join(MODES)}, got {options.mode!r}")
    if options.max_bad_rows < 0:
        raise ValueError(f"max_bad_rows must be >= 0, got {options.max_bad_rows}")
    local = Path(name).exists()
    if options.mode == "memory":
        if not local or Path(name).is_dir():
            raise ValueError(f"{name}: a folder or a Hub data set is read with data mode 'mmap' or 'stream'")
        if options.max_bad_rows:
            raise ValueError(
                "max_bad_rows applies to data modes 'mmap' and 'stream'; 'memory' stops at a bad row"
            )
        return read_table(name, columns=options.columns, header=options.header)
    generator, kwargs, where = _generator(str(name), options, local=local)
    datasets = _datasets()
    if options.mode == "stream":
        stream = datasets.IterableDataset.from_generator(generator, gen_kwargs=kwargs)
        return StreamSource(stream, path=where, window=options.window, bad=options.bad_rows())
    try:
        features = _features(generator, kwargs, where)
        table = datasets.Dataset.from_generator(
            generator,
            features=features,
            gen_kwargs=kwargs,
            cache_dir=options.cache_dir,
            writer_batch_size=ARROW_BATCH_ROWS,
        )
    except datasets.exceptions.DatasetGenerationError as err:
        cause = err.__cause__
        raise (cause if isinstance(cause, DataError) else err) from None
    return ArrowSource(table, path=where, bad=options.bad_rows())


def _features(
    generator: Callable[..., Iterator[dict[str, object]]], kwargs: dict[str, object], where: str
) -> datasets.Features:
    """The Arrow cache's columns and types, from the first good row (a bad row's record has only its error, and
    a batch of rows without one would otherwise type the error column as null)."""
    first = next((r for r in generator(**kwargs) if BAD not in r), None)
    if first is None:
        raise DataError(f"{where}:1: the data has no rows")
    pa = require("pyarrow")
    features = _datasets().Features.from_arrow_schema(pa.Table.from_pylist([first]).schema)
    features[BAD] = _datasets().Value("string")
    return features


def _generator(
    name: str, options: SourceOptions, *, local: bool
) -> tuple[Callable[..., Iterator[dict[str, object]]], dict[str, object], str]:
    if not local:
        return hub_rows, {"name": name, "split": options.split, "columns": options.columns,
                          "max_bad_rows": options.max_bad_rows}, name  # fmt: skip
    files = data_files(name)
    kwargs = {
        "files": [str(f) for f in files],
        "numbers": list(range(len(files))),
        "columns": options.columns,
        "header": options.header,
        "max_bad_rows": options.max_bad_rows,
        "stamps": [(f.stat().st_size, f.stat().st_mtime_ns) for f in files],
    }
    return file_rows, kwargs, str(name)


def _datasets() -> ModuleType:
    datasets = require("datasets")
    datasets.disable_progress_bars() if not sys.stderr.isatty() else None
    return datasets


def row_count(data: Dataset | RowSource) -> int | None:
    """Rows in ``data`` (``None`` for a stream of unknown length)."""
    return len(data) if isinstance(data, Dataset) else data.num_rows


def plan_window(data: Dataset | RowSource, default: int | None) -> int | None:
    """Rows per shuffle window of the training plan: a stream's own window, else ``default`` (None: the task
    is shuffled whole)."""
    return data.window if isinstance(data, StreamSource) else default


def window_counter(data: Dataset | RowSource) -> Callable[[int, int], int] | None:
    """For a source of unknown length, ``(start, end) -> rows present`` (reads that window); else None."""
    if row_count(data) is not None:
        return None
    first = data.text_columns[0]
    return lambda start, end: len(data.rows(start, end)[first])
