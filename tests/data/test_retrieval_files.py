"""Retrieval folders read through the shared readers: duplicate keys and columns, invalid UTF-8 and broken
JSON are errors naming file, line and column."""

from __future__ import annotations

import pytest

from embforge.data.retrieval import load_beir
from embforge.data.tables import DataError


def _folder(tmp_path, corpus=None, queries=None, qrels=None):
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_bytes(
        corpus or b'{"_id": "d1", "text": "a cat"}\n{"_id": "d2", "text": "a dog"}\n'
    )
    (root / "queries.jsonl").write_bytes(queries or b'{"_id": "q1", "text": "cat?"}\n')
    (root / "qrels" / "test.tsv").write_bytes(qrels or b"query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return root


def test_a_valid_folder_reads(tmp_path):
    data = load_beir(_folder(tmp_path))
    assert data.doc_ids == ["d1", "d2"] and data.qrels == {"q1": {"d1": 1}}


@pytest.mark.parametrize(
    ("part", "content", "expected"),
    [
        (
            "corpus",
            b'{"_id": "d1", "text": "a", "text": "b"}\n',
            r"corpus\.jsonl:1:\d+: duplicate key 'text'",
        ),
        ("corpus", b'{"_id": "d1", "text": "caf\xe9"}\n', r"corpus\.jsonl:1:27: invalid UTF-8 \(byte 0xe9\)"),
        ("queries", b'{"_id": "q1", "text": "cat?"\n', r"queries\.jsonl:1:\d+: invalid JSON"),
        ("qrels", b"query-id\tcorpus-id\tcorpus-id\nq1\td1\td2\n", r"test\.tsv:1: .*'corpus-id' twice"),
        ("qrels", b"query-id\tcorpus-id\tscore\nq1\td1\n", r"test\.tsv:2: expected 3 columns, found 2"),
        ("qrels", b"query-id\tcorpus-id\tscore\nq1\td\xff1\t1\n", r"test\.tsv:2:5: invalid UTF-8"),
    ],
)
def test_broken_files_name_file_line_and_column(tmp_path, part, content, expected):
    with pytest.raises(DataError, match=expected):
        load_beir(_folder(tmp_path, **{part: content}))
