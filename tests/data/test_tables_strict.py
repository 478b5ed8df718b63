"""Readers refuse what they should (issue #15 item 6): unknown or duplicate columns, loose numbers, dropped rows,
and decode problems that must name file, line and column."""

from __future__ import annotations

import json

import pytest

from embforge.data.tables import DataError, read_table


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_header_with_an_unknown_column_is_refused_not_read_as_a_row(tmp_path):
    path = write(tmp_path / "t.csv", "anchor,positive,negative,source\nq,p,n,wiki\nq2,p2,n2,web\n")
    with pytest.raises(DataError, match=r"t\.csv:1: .*'source'.*--columns"):
        read_table(path)
    # naming the wanted columns drops the others
    data = read_table(path, columns="anchor=anchor,positive=positive,negative=negative")
    assert data.columns == {"anchor": ["q", "q2"], "positive": ["p", "p2"], "negative": ["n", "n2"]}


def test_standard_names_match_whatever_their_case(tmp_path):
    data = read_table(write(tmp_path / "s.csv", "Sentence1,SENTENCE2,Score\na cat,a dog,4.5\n"))
    assert data.columns == {"sentence1": ["a cat"], "sentence2": ["a dog"], "score": [4.5]}
    assert data.lines == [2]


def test_two_sources_mapped_to_one_column_are_refused(tmp_path):
    path = write(tmp_path / "m.csv", "a,b,c\nx,y,1\n")
    with pytest.raises(DataError, match=r"m\.csv:1: .*'a' and 'b' both map to 'sentence1'"):
        read_table(path, columns="a=sentence1,b=sentence1,c=score")


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("empty.csv", "a,b,1\nc, ,2\n", r"empty\.csv:2: column 'sentence2': empty text"),
        ("nan.csv", "a,b,1\nc,d,nan\n", r"nan\.csv:2: column 'score': 'nan' is not a finite number"),
        ("word.csv", "a,b,1\nc,d,high\n", r"word\.csv:2: column 'score': 'high' is not a number"),
        ("ragged.csv", "a,b,1\nc,d\n", r"ragged\.csv:2: expected 3 columns, found 2"),
        ("q.csv", 'text,label\na,1\n"never closed,0\nb,1\n', r"q\.csv:3:1: quoted field never closed"),
        ("q.csv", 'text,label\na,1\n"x"y,0\n', r"q\.csv:3:4: unexpected 'y' after the closing quote"),
        ("q.csv", "text,label\na\rb,1\n", r"q\.csv:2:2: line break inside an unquoted field"),
        (
            "d.csv",
            "sentence1,sentence2,score,score\na,b,1,5\n",
            r"d\.csv:1: .*'score' twice \(columns 3 and 4\)",
        ),
        ("ragged.tsv", "a\tb\t1\n\nc\td\t1\te\n", r"ragged\.tsv:3: expected 3 columns, found 4"),
        ("d.tsv", "text\tlabel\tLabel\nx\t1\t2\n", r"d\.tsv:1: .*'label' twice \(columns 2 and 3\)"),
    ],
)
def test_malformed_csv_names_file_line_and_column(tmp_path, name, content, expected):
    """Duplicate columns, loose numbers, empty cells, ragged rows, broken quoting: refused, with file and line
    (and column where the text is at fault)."""
    with pytest.raises(DataError, match=expected):
        read_table(write(tmp_path / name, content))


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (['{"text": "a", "label": 1, "label": 0}'], r"1:\d+: duplicate key 'label'"),
        (['{"text": "a", "label": 1}', '{"text": "b"}'], r"2: column 'label': missing"),
        (['{"text": "a", "label": 1}', '{"text": "b",'], r"2:\d+: invalid JSON"),
        (['{"text": null, "label": 1}'], r"1: column 'text': missing value"),
        (['{"text": "a", "score": true}'], r"1: column 'score': True is not a number"),
        (['{"text": "a", "score": "1_0"}'], r"1: column 'score': '1_0' is not a number"),
        (['{"text": "a", "label": false}'], r"1: column 'label': False is not a valid label"),
        (['{"text": "a", "label": 1.5}'], r"1: column 'label': 1.5 is not a valid label"),
        (['{"text": "a", "score": 1e999}'], r"1: column 'score': .* is not a finite number"),
    ],
)
def test_malformed_json_lines_name_file_line_and_column(tmp_path, lines, expected):
    """Duplicate keys, missing or null values, loose numbers, broken JSON: refused, with file and line (and
    column where the JSON is at fault)."""
    with pytest.raises(DataError, match=rf"b\.jsonl:{expected}"):
        read_table(write(tmp_path / "b.jsonl", "".join(line + "\n" for line in lines)))


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("1_0", "is not a number"),
        ("0x10", "is not a number"),
        ("inf", "is not a finite number"),
        (" ", "is not a number"),
    ],
)
def test_strict_numbers_in_csv(tmp_path, cell, expected):
    path = write(tmp_path / "n.csv", f"a,b,1\nc,d,2\ne,f,{cell}\n")
    with pytest.raises(DataError, match=rf"n\.csv:3: column 'score': .* {expected}"):
        read_table(path)


def test_integer_labels_with_a_stray_word_are_refused(tmp_path):
    path = write(tmp_path / "l.csv", "text,label\na,0\nb,1\nc,1_0\nd,1\n")
    with pytest.raises(
        DataError, match=r"l\.csv:4: column 'label': '1_0' is not an integer like the other labels"
    ):
        read_table(path)


def test_empty_rows_of_a_one_column_file_are_errors(tmp_path):
    path = write(tmp_path / "o.csv", "text\nhello\n\nworld\n")
    with pytest.raises(DataError, match=r"o\.csv:3: column 'text': empty text"):
        read_table(path)
    # blank lines after the last row are not rows
    assert read_table(write(tmp_path / "end.csv", "text\nhello\nworld\n\n\n")).columns["text"] == [
        "hello",
        "world",
    ]


@pytest.mark.parametrize("suffix", ["csv", "tsv", "jsonl"])
def test_invalid_utf8_names_file_line_and_column(tmp_path, suffix):
    rows = {
        "csv": b"text,label\nfine,1\nab\xffc,0\n",
        "tsv": b"text\tlabel\nfine\t1\nab\xffc\t0\n",
        "jsonl": b'{"text": "fine", "label": 1}\n{"text": "ab\xffc", "label": 0}\n',
    }[suffix]
    path = tmp_path / f"u.{suffix}"
    path.write_bytes(rows)
    line, column = (2, 13) if suffix == "jsonl" else (3, 3)
    with pytest.raises(DataError, match=rf"u\.{suffix}:{line}:{column}: invalid UTF-8 \(byte 0xff\)"):
        read_table(path)


def test_a_10_mb_csv_field_is_read(tmp_path):
    big = "word " * 2_000_000
    path = write(tmp_path / "big.csv", f'text,label\n"{big}",1\nsmall,0\n')
    data = read_table(path)
    assert len(data.columns["text"][0]) == len(big) and data.lines == [2, 3]


def test_broken_json_lines_name_line_and_column(tmp_path):
    path = write(tmp_path / "j.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": }\n')
    with pytest.raises(DataError, match=r"j\.jsonl:2:24: invalid JSON \(Expecting value\)"):
        read_table(path)
    array = write(tmp_path / "a.json", json.dumps([{"text": "a", "label": 1}]) + "\n")
    with pytest.raises(
        DataError, match=r"a\.json:1:1: expected a JSON object, found list.*one object per line"
    ):
        read_table(array)


def test_parquet_duplicate_columns_and_garbage_are_data_errors(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.Table.from_arrays([pa.array(["a", "b"]), pa.array(["c", "d"])], names=["text", "text"])
    pq.write_table(table, tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"d\.parquet: .*'text' twice"):
        read_table(tmp_path / "d.parquet")
    (tmp_path / "g.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match=r"g\.parquet: not a readable Parquet file"):
        read_table(tmp_path / "g.parquet")
