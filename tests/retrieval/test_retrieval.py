"""Retrieval data (BEIR folders, mapped CSV/JSONL), resumable corpus encoding, retrieval evaluation, SciFact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embforge.data.retrieval import load_beir, load_retrieval_files
from embforge.data.tables import DataError
from embforge.evaluate.ranking import evaluate_run
from embforge.evaluate.retrieval import evaluate_retrieval, search_run
from embforge.retrieval.corpus_cache import encode_corpus, load_encoded
from tests.conftest import requires_data, requires_minilm

CORPUS = [
    ("d1", "Guitar", "a man plays the guitar"),
    ("d2", "", "a woman sings a song"),
    ("d3", "Markets", "the stock market rises"),
    ("d4", "", "oil price falls"),
    ("d5", "", "a child reads a book"),
]


def _beir(root: Path, *, corpus=CORPUS, qrels="q1\td1\t1\nq2\td3\t2\nq2\td4\t1\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in corpus)
    )
    (root / "queries.jsonl").write_text(
        json.dumps({"_id": "q1", "text": "guitar music"})
        + "\n"
        + json.dumps({"_id": "q2", "text": "money"})
        + "\n"
    )
    (root / "qrels").mkdir(exist_ok=True)
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return root


def test_load_beir_folder(tmp_path):
    data = load_beir(_beir(tmp_path / "beir"))
    assert data.doc_ids == ["d1", "d2", "d3", "d4", "d5"]
    assert (
        data.documents[0] == "Guitar a man plays the guitar" and data.documents[1] == "a woman sings a song"
    )
    assert data.qrels == {"q1": {"d1": 1}, "q2": {"d3": 2, "d4": 1}}


def test_mapped_csv_files(tmp_path):
    (tmp_path / "docs.csv").write_text("doc_id,abstract\nA,first doc\nB,second doc\n")
    (tmp_path / "q.csv").write_text("qid,question\n1,which doc\n")
    (tmp_path / "rel.csv").write_text("qid,doc\n1,B\n")
    data = load_retrieval_files(
        tmp_path / "docs.csv",
        tmp_path / "q.csv",
        tmp_path / "rel.csv",
        corpus_columns={"doc_id": "_id", "abstract": "text"},
        query_columns={"qid": "_id", "question": "text"},
        qrels_columns={"qid": "query-id", "doc": "corpus-id"},
    )
    assert data.documents == ["first doc", "second doc"] and data.qrels == {"1": {"B": 1}}


def test_bad_inputs_name_file_and_line(tmp_path):
    with pytest.raises(DataError, match=r"test\.tsv:3: qrels name document 'd9', which is not in the corpus"):
        load_beir(_beir(tmp_path / "a", qrels="q1\td1\t1\nq2\td9\t1\n"))
    with pytest.raises(DataError, match=r"test\.tsv:2: qrels name query 'q7'"):
        load_beir(_beir(tmp_path / "b", qrels="q7\td1\t1\n"))
    with pytest.raises(DataError, match=r"corpus\.jsonl:3: duplicate corpus id 'd1' \(first on line 1\)"):
        load_beir(_beir(tmp_path / "c", corpus=[*CORPUS[:2], ("d1", "", "again")]))
    with pytest.raises(DataError, match=r"corpus\.jsonl:1: the corpus is empty"):
        load_beir(_beir(tmp_path / "d", corpus=[]))
    with pytest.raises(DataError, match=r"test\.tsv:2: qrels score 'high' is not an integer grade"):
        load_beir(_beir(tmp_path / "e", qrels="q1\td1\thigh\n"))
    with pytest.raises(FileNotFoundError, match="splits available: test"):
        load_beir(tmp_path / "a", split="dev")


def test_encoding_resumes_without_re_encoding(tiny_encoder, tmp_path):
    texts = [
        f"{w} plays the guitar in the park" * (i % 4 + 1) for i, w in enumerate(["a man", "a woman"] * 15)
    ]
    ids = [f"doc{i}" for i in range(len(texts))]
    calls: list[int] = []
    original = tiny_encoder.encode

    def counting_encode(batch, **kw):
        calls.append(len(batch))
        return original(batch, **kw)

    tiny_encoder.encode = counting_encode

    def interrupt(block: int) -> None:
        if block == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        encode_corpus(
            tiny_encoder, texts, ids, tmp_path / "enc", block_size=8, on_block=interrupt, show_progress=False
        )
    assert calls == [8, 8, 8]
    calls.clear()
    resumed = encode_corpus(tiny_encoder, texts, ids, tmp_path / "enc", block_size=8, show_progress=False)
    assert calls == [6]  # only the last block (30 = 8 + 8 + 8 + 6) is encoded again
    expected = original(texts)
    np.testing.assert_allclose(np.asarray(resumed), expected, atol=1e-5)
    assert load_encoded(tmp_path / "enc")[0] == ids
    # different texts: the cache is not reused
    calls.clear()
    encode_corpus(
        tiny_encoder, [*texts[:-1], "new"], ids, tmp_path / "enc", block_size=8, show_progress=False
    )
    assert sum(calls) == 30


def test_cached_ids_round_trip_any_character(tiny_encoder, tmp_path):
    # ids are strings from the user's corpus: a line separator (U+2028, \x85, \r, \n) inside one must not split it
    ids = ["plain", "with\u2028separator", "nel\x85id", "cr\rid", "nl\nid", "tab\tid"]
    texts = [f"document number {i}" for i in range(len(ids))]
    encode_corpus(tiny_encoder, texts, ids, tmp_path / "enc", show_progress=False)
    assert load_encoded(tmp_path / "enc")[0] == ids


def test_search_run_and_evaluation_agree(tiny_encoder, tmp_path):
    data = load_beir(_beir(tmp_path / "beir"))
    run = search_run(tiny_encoder, data, depth=5)
    assert all(len(docs) == 5 for docs in run.values())
    metrics = evaluate_retrieval(tiny_encoder, data, metrics=["ndcg@10", "recall@2"])
    expected = evaluate_run(run, data.qrels, ["ndcg@10", "recall@2"])
    assert metrics["ndcg@10"] == pytest.approx(100 * expected["ndcg@10"])
    assert metrics["recall@2"] == pytest.approx(100 * expected["recall@2"])
    cached = evaluate_retrieval(
        tiny_encoder, data, metrics=["ndcg@10"], corpus_cache=tmp_path / "cache", index="flat"
    )
    assert cached["ndcg@10"] == pytest.approx(metrics["ndcg@10"], abs=1e-4)


@requires_data
def test_scifact_split_is_deterministic_and_disjoint():
    from embforge.data.builtin.scifact import join_sentences, load_scifact

    train, dev = load_scifact("train"), load_scifact("dev")
    assert (len(train.query_ids), len(dev.query_ids)) == (688, 121)
    assert not set(train.query_ids) & set(dev.query_ids)
    assert len(train.doc_ids) == len(set(train.doc_ids)) == 5183
    assert join_sentences("['First one.'\n 'Second.']") == "First one. Second."


@pytest.mark.integration
@requires_minilm
@requires_data
def test_minilm_scifact_dev_matches_pytrec_eval():
    pytrec_eval = pytest.importorskip("pytrec_eval")
    from embforge.data.builtin.scifact import load_scifact
    from embforge.encoder import Encoder

    data = load_scifact("dev")
    data = data.subset_queries(data.query_ids[:20])
    model = Encoder.load("all-MiniLM-L6-v2", max_seq_length=128)
    # a ~120-document slice that keeps every judged document, to stay fast on a CPU
    judged = {d for rel in data.qrels.values() for d in rel}
    keep = [i for i, d in enumerate(data.doc_ids) if d in judged or i < 100]
    data.doc_ids = [data.doc_ids[i] for i in keep]
    data.doc_texts = [data.doc_texts[i] for i in keep]
    data.doc_titles = [data.doc_titles[i] for i in keep]
    run = search_run(model, data, depth=100)
    ours = evaluate_run(run, data.qrels, ["ndcg@10", "recall@100"])
    theirs = pytrec_eval.RelevanceEvaluator(data.qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    assert ours["ndcg@10"] == pytest.approx(np.mean([v["ndcg_cut_10"] for v in theirs.values()]))
    assert ours["recall@100"] == pytest.approx(np.mean([v["recall_100"] for v in theirs.values()]))
    assert ours["ndcg@10"] > 0.5  # MiniLM finds SciFact evidence well (BEIR test NDCG@10 is ~0.65 on 5k docs)


def test_cli_eval_mine_index(tiny_model_dir, tmp_path, capsys):
    from embforge.cli import main

    root = _beir(tmp_path / "beir")
    assert main(["eval", "retrieval", "--model", str(tiny_model_dir), "--data", str(root)]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"ndcg@10", "mrr@10", "recall@100"} <= set(metrics) and 0 <= metrics["ndcg@10"] <= 100
    out = tmp_path / "mined.jsonl"
    argv = ["mine", "--data", str(root), "--split", "test", "--method", "bm25", "--output", str(out)]
    assert main([*argv, "--num-negatives", "2", "--depth", "4"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and set(rows[0]) == {"anchor", "positive", "negative_1", "negative_2"}
    capsys.readouterr()
    index = tmp_path / "idx"
    build = ["index", "build", "--model", str(tiny_model_dir), "--data", str(root), "--output", str(index)]
    assert main([*build, "--kind", "flat"]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "index",
                "search",
                "--model",
                str(tiny_model_dir),
                "--index",
                str(index),
                "--query",
                "oil",
                "-k",
                "2",
            ]
        )
        == 0
    )
    hits = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"][0]["hits"]
    assert len(hits) == 2 and hits[0]["score"] >= hits[1]["score"]
    assert (
        main(["eval", "retrieval", "--model", str(tiny_model_dir), "--data", str(root), "--split", "dev"])
        == 2
    )
    assert "splits available: test" in capsys.readouterr().err
