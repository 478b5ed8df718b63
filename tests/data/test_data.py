"""Reading tables: formats, headers, column mappings, and errors that name file, line and column."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embforge.data.tables import DataError, read_table
from tests.conftest import requires_data, shared_data


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_headerless_csv_guesses_scored_pairs(tmp_path):
    data = read_table(write(tmp_path / "a.csv", 'a cat,"a dog, barking",4.5\nx,y,0\n'))
    assert data.text_columns == ["sentence1", "sentence2"]
    assert data.columns["sentence2"][0] == "a dog, barking"
    np.testing.assert_allclose(data.labels(), [4.5, 0.0])
    assert data.lines == [1, 2]


def test_header_jsonl_parquet_and_mapping(tmp_path):
    csv_data = read_table(write(tmp_path / "t.csv", "anchor,positive,negative_1,negative_2\nq,p,n1,n2\n"))
    assert csv_data.text_columns == ["anchor", "positive", "negative_1", "negative_2"]
    rows = [{"q": "what", "d": "that", "extra": 1}, {"q": "who", "d": "him", "extra": 2}]
    jsonl = write(tmp_path / "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    mapped = read_table(jsonl, columns="q=anchor,d=positive")
    assert mapped.columns == {"anchor": ["what", "who"], "positive": ["that", "him"]}
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "b"], "label": ["x", "y"]}), tmp_path / "t.parquet")
    parquet = read_table(tmp_path / "t.parquet")
    assert parquet.columns["label"] == [0, 1] and parquet.label_names == ["x", "y"]
    tsv = read_table(
        write(tmp_path / "t.tsv", 'he said "hi"\tok\t1\n'), columns="0=sentence1,1=sentence2,2=label"
    )
    assert tsv.columns["sentence1"] == ['he said "hi"'] and tsv.columns["label"] == [1]


def test_missing_column_and_label_set(tmp_path):
    data = read_table(write(tmp_path / "p.csv", "sentence1,sentence2\na,b\n"))
    with pytest.raises(DataError, match=r"p\.csv:1: missing column 'score' needed by STS"):
        data.require(["score"], purpose="STS evaluation")
    with pytest.raises(
        DataError, match=r"l\.csv:3: column 'label': 7 is not one of the allowed labels \[0, 1\]"
    ):
        read_table(write(tmp_path / "l.csv", "text,label\na,1\nb,7\n"), label_set=[0, 1])
    with pytest.raises(DataError, match="no data rows"):
        read_table(write(tmp_path / "e.csv", "text,label\n"))
    with pytest.raises(ValueError, match="unknown standard column"):
        read_table(write(tmp_path / "m.csv", "a,b\n"), columns="0=query,1=doc")


@requires_data
def test_real_files_read_without_loss():
    stsb = read_table(shared_data() / "stsb_en" / "stsb-en-train.csv")
    assert len(stsb) == 5749 and stsb.label_column == "score"
    mrpc = read_table(
        shared_data() / "mrpc" / "msr_paraphrase_train.txt",
        header=True,
        columns="3=sentence1,4=sentence2,0=label",
    )
    assert len(mrpc) == 4076 and sum(mrpc.columns["label"]) == 2753
