"""A quick look at a retrieval set (issue #48): ``--max-queries N`` keeps the first N queries with qrels,
``--max-corpus M`` a corpus of their judged documents plus the first M others; deterministic, and reported."""

from __future__ import annotations

import json

import pytest

from embforge.cli import main
from embforge.data.retrieval import RetrievalData
from tests.retrieval.test_retrieval import _beir

DATA = RetrievalData(
    doc_ids=["d1", "d2", "d3", "d4", "d5", "d6"],
    doc_texts=["one", "two", "three", "four", "five", "six"],
    query_ids=["q0", "q1", "q2", "q3"],
    query_texts=["no qrels", "first", "second", "third"],
    qrels={"q1": {"d5": 1}, "q2": {"d2": 1, "d6": 0}, "q3": {"d1": 2}},
    doc_titles=["T1", "", "", "", "", ""],
    name="toy",
)


def test_the_first_queries_with_qrels_and_their_documents_plus_the_first_others():
    small = DATA.subset(max_queries=2, max_corpus=1)
    assert small.query_ids == ["q1", "q2"] and small.query_texts == ["first", "second"]
    assert small.qrels == {"q1": {"d5": 1}, "q2": {"d2": 1, "d6": 0}}
    assert small.doc_ids == [
        "d1",
        "d2",
        "d5",
        "d6",
    ]  # the judged d2, d5, d6 and the first other, d1; corpus order
    assert small.documents == ["T1 one", "two", "five", "six"]
    assert small.subset(max_queries=2, max_corpus=1) == small  # deterministic


def test_max_queries_alone_keeps_the_whole_corpus_and_max_corpus_alone_every_query():
    assert DATA.subset(max_queries=1).doc_ids == DATA.doc_ids
    assert DATA.subset(max_queries=1).query_ids == ["q1"]
    every = DATA.subset(max_corpus=0)
    assert every.query_ids == ["q1", "q2", "q3"] and every.doc_ids == ["d1", "d2", "d5", "d6"]


def test_eval_retrieval_reports_the_subset(tiny_model_dir, tmp_path, capsys):
    root = _beir(tmp_path / "beir")
    argv = ["eval", "retrieval", "--model", str(tiny_model_dir), "--data", str(root), "--split", "test"]
    assert main([*argv, "--max-queries", "1", "--max-corpus", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["queries"] == 1 and result["documents"] == 3  # q1's d1, then d2 and d3
    assert result["subset"] == {"max_queries": 1, "max_corpus": 2, "of_queries": 2, "of_documents": 5}
    assert main(argv) == 0
    assert "subset" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_mine_takes_the_subset_and_refuses_it_in_pairs_mode(tmp_path, capsys):
    root = _beir(tmp_path / "beir")
    out = tmp_path / "mined.jsonl"
    argv = ["mine", "--data", str(root), "--split", "test", "--method", "bm25", "--output", str(out)]
    assert main([*argv, "--num-negatives", "1", "--max-queries", "1"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["positive"] for r in rows] == ["Guitar a man plays the guitar"]  # q1 only
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("anchor,positive\na cat,a dog\n")
    assert main(["mine", "--pairs", str(pairs), "--output", str(out), "--max-queries", "1"]) == 2
    assert "--max-queries applies to --data" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--max-queries", "--max-corpus"])
def test_the_subset_flags_are_range_checked(flag, capsys):
    with pytest.raises(SystemExit):
        main(["eval", "retrieval", "--model", "m", "--data", "d", flag, "-1"])
    assert f"argument {flag}: must be" in capsys.readouterr().err
