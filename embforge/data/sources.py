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
(:mod:`embforge.data.rows`); a name that is not a local path is a Hugging Face Hub data set (``datasets.load_dataset``
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
import os
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from embforge._optional import require
from embforge.data.columns import NamedColumns
from embforge.data.rows import BAD, LINE, BadRows, data_files, file_rows, hub_rows
from embforge.data.tables import Dataset, read_table
from embforge.files import DataError

if TYPE_CHECKING:
    import datasets

__all__ = [
    "LINE",
    "MODES",
    "ArrowSource",
    "BadRows",
    "RowSource",
    "SourceOptions",
    "StreamSource",
    "data_files",
    "hub_rows",
    "open_source",
    "plan_window",
    "row_count",
    "source_files",
    "window_counter",
]

MODES = ("memory", "mmap", "stream")
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
        self._keys = [key for key in first if key != BAD]  # what a buffered window holds, empty or not
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
        self._buffer = {name: [r[name] for r in records] for name in self._keys}
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


def source_files(data: Dataset | RowSource) -> list[Path]:
    """The local files ``data``'s rows are read from: a table's file, a source's file or folder's data files ([]
    for a Hub data set and rows made in memory)."""
    path = Path(data.path)
    if isinstance(data, Dataset) or path.is_file():
        return [path] if path.is_file() else []
    return data_files(path) if path.is_dir() else []


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
