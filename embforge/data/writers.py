"""Writing a :class:`~embforge.data.tables.Dataset` back to CSV, TSV, JSONL or Parquet, so that
:func:`~embforge.data.tables.read_table` reads the same rows (a header of standard names; string labels as their
names). Files are written atomically.

>>> import tempfile, pathlib
>>> from embforge.data.tables import Dataset, read_table
>>> rows = Dataset("x", {"sentence1": ['say "hi", twice'], "sentence2": ["a\\nb"], "score": [4.5]}, [1])
>>> path = write_table(rows, pathlib.Path(tempfile.mkdtemp()) / "pairs.csv")
>>> read_table(path).columns == rows.columns
True
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

from embforge._optional import require
from embforge.data.tables import Dataset
from embforge.files import write_bytes_atomic, write_jsonl, write_text_atomic

_TSV_FORBIDDEN = {"\t": "a tab", "\n": "a line break", "\r": "a carriage return"}


def write_table(data: Dataset, path: str | os.PathLike) -> Path:
    """Write ``data``'s text columns (canonical order) and its label column, chosen by the file's suffix.

    Raises:
        ValueError: for a TSV cell holding a tab or a line break (TSV has no quoting: write CSV or JSONL).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [*data.text_columns, *([data.label_column] if data.label_column else [])]
    rows = [[_cell(data, name, i) for name in names] for i in range(len(data))]
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return write_jsonl(path, (dict(zip(names, row)) for row in rows))
    if suffix == ".parquet":
        return _write_parquet(path, names, rows)
    if suffix == ".csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\r\n")  # quotes any cell holding \r or \n
        writer.writerow(names)
        writer.writerows(rows)
        return write_text_atomic(path, buffer.getvalue())
    for i, row in enumerate(rows):
        for name, cell in zip(names, row):
            for char, what in _TSV_FORBIDDEN.items():
                if isinstance(cell, str) and char in cell:
                    raise ValueError(
                        f"{path}: row {i + 1}, column {name!r} holds {what}, which TSV cannot represent (it has "
                        "no quoting); write a .csv or .jsonl file instead"
                    )
    lines = ["\t".join(names)] + ["\t".join(str(c) for c in row) for row in rows]
    return write_text_atomic(path, "".join(line + "\n" for line in lines))


def _cell(data: Dataset, name: str, row: int) -> object:
    value = data.columns[name][row]
    if name == "label" and data.label_names is not None:
        return data.label_names[value]
    return value


def _write_parquet(path: Path, names: list[str], rows: list[list[object]]) -> Path:
    pa = require("pyarrow")
    pq = require("pyarrow.parquet")
    table = pa.table({name: [row[j] for row in rows] for j, name in enumerate(names)})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return write_bytes_atomic(path, sink.getvalue().to_pybytes())
