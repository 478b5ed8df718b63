"""``--columns`` renames the columns it names and keeps the others (issue #48), as ``datasets``' ``rename_columns``
does: ``category=label`` keeps ``text``; ``query=sentence1,candidate=sentence2`` keeps ``label``. A column whose
own name a renamed one takes is left out; a header-less file's unmapped positions have no name and stay out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embforge.data.sources import SourceOptions, open_source

ROWS = [
    {"query": "a man plays guitar", "candidate": "a man is playing", "label": 1, "text": "music"},
    {"query": "a cat runs", "candidate": "the stock market rises", "label": 0, "text": "animals"},
]


def _write(path: Path, rows: list[dict[str, object]], *, header: bool = True) -> Path:
    keys = list(rows[0])
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        sep = "," if path.suffix == ".csv" else "\t"
        lines = ([sep.join(keys)] if header else []) + [sep.join(str(r[k]) for k in keys) for r in rows]
        path.write_text("\n".join(lines) + "\n")
    return path


def _columns(path: Path, columns: str | None, mode: str) -> dict[str, list]:
    data = open_source(path, SourceOptions(mode=mode, columns=columns))
    got = data.rows(0, 2) if hasattr(data, "rows") else data.columns
    return {name: list(got[name]) for name in sorted(data.columns)}


SUFFIXES = [".csv", ".tsv", ".jsonl", ".parquet"]
MODES = ["memory", "mmap", "stream"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_mapping_keeps_the_columns_it_does_not_name(tmp_path, suffix, mode):
    path = _write(tmp_path / f"pairs{suffix}", ROWS)
    got = _columns(path, "query=sentence1,candidate=sentence2", mode)
    assert got == {
        "label": [1, 0],
        "sentence1": ["a man plays guitar", "a cat runs"],
        "sentence2": ["a man is playing", "the stock market rises"],
        "text": ["music", "animals"],
    }


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_renamed_column_takes_the_place_of_the_one_with_its_name(tmp_path, suffix, mode):
    rows = [{"text": r["query"], "category": r["label"], "label": r["text"]} for r in ROWS]
    path = _write(tmp_path / f"topics{suffix}", rows)
    got = _columns(path, "category=label", mode)  # the class names of the old label are gone
    assert got == {"label": [1, 0], "text": ["a man plays guitar", "a cat runs"]}


def test_a_positional_map_of_a_headerless_file_keeps_working(tmp_path):
    path = _write(tmp_path / "pairs.tsv", ROWS, header=False)
    got = _columns(path, "0=sentence1,1=sentence2,2=label", "memory")
    assert got == {
        "label": [1, 0],
        "sentence1": ["a man plays guitar", "a cat runs"],
        "sentence2": ["a man is playing", "the stock market rises"],
    }


@pytest.mark.parametrize("mode", ["mmap", "stream"])
@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_integer_labels_of_a_delimited_file_stream(tmp_path, suffix, mode):
    path = _write(tmp_path / f"topics{suffix}", [{"text": r["query"], "label": r["label"]} for r in ROWS])
    assert _columns(path, None, mode) == {"label": [1, 0], "text": ["a man plays guitar", "a cat runs"]}
