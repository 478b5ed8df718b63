"""Ranking metrics against pytrec_eval (trec_eval) on random and hand-built runs."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embforge.evaluate.ranking import evaluate_run, evaluate_run_per_query, parse_metric, rank_documents

METRICS = {
    "ndcg@10": "ndcg_cut_10",
    "ndcg@3": "ndcg_cut_3",
    "map@100": "map_cut_100",
    "map@5": "map_cut_5",
    "recall@100": "recall_100",
    "recall@5": "recall_5",
    "precision@10": "P_10",
    "precision@5": "P_5",
    "ndcg": "ndcg",
    "map": "map",
    "mrr": "recip_rank",
}
TREC_MEASURES = {"ndcg_cut.3,10", "map_cut.5,100", "recall.5,100", "P.5,10", "ndcg", "map", "recip_rank"}


def _trec(run, qrels, measures=TREC_MEASURES):
    return pytest.importorskip("pytrec_eval").RelevanceEvaluator(qrels, measures).evaluate(run)


docs = st.sampled_from([f"d{i}" for i in range(25)])
# few distinct scores so that ties are frequent: the tie-break must match trec_eval's (docid descending)
scores = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, -1.5, 3.0])
one_run = st.dictionaries(docs, scores, min_size=1, max_size=20)
runs = st.fixed_dictionaries({"q1": one_run, "q2": one_run, "q3": one_run})
qrels_st = st.dictionaries(
    st.sampled_from(["q1", "q2", "q3"]),
    st.dictionaries(docs, st.integers(0, 3), min_size=1, max_size=8),
    min_size=1,
)


@settings(max_examples=300, deadline=None)
@given(run=runs, qrels=qrels_st)
def test_equals_pytrec_eval_per_query(run, qrels):
    ours = evaluate_run_per_query(run, qrels, list(METRICS))
    theirs = _trec(run, qrels)
    assert set(theirs) == set(qrels)
    for qid, values in theirs.items():
        for name, trec_name in METRICS.items():
            assert ours[name][qid] == pytest.approx(values[trec_name], abs=1e-9), (qid, name)


@settings(max_examples=100, deadline=None)
@given(run=runs, qrels=qrels_st)
def test_mrr_at_k_is_recip_rank_of_the_cut_run(run, qrels):
    cut_run = {q: {d: run[q][d] for d in rank_documents(run[q])[:3]} for q in run}
    theirs = _trec(cut_run, qrels, {"recip_rank"})
    ours = evaluate_run_per_query(run, qrels, ["mrr@3"])["mrr@3"]
    for qid, values in theirs.items():
        assert ours[qid] == pytest.approx(values["recip_rank"], abs=1e-12)


def test_means_match_when_every_query_is_run():
    run = {"q1": {"a": 3.0, "b": 2.0, "c": 1.0}, "q2": {"a": 1.0, "b": 1.0, "c": 1.0}}
    qrels = {"q1": {"c": 1, "a": 0}, "q2": {"a": 2, "b": 1}}
    theirs = _trec(run, qrels)
    ours = evaluate_run(run, qrels, list(METRICS))
    for name, trec_name in METRICS.items():
        expected = sum(v[trec_name] for v in theirs.values()) / len(theirs)
        assert ours[name] == pytest.approx(expected, abs=1e-12)


def test_ties_broken_by_docid_descending():
    assert rank_documents({"a": 1.0, "c": 1.0, "b": 1.0, "z": 0.5}) == ["c", "b", "a", "z"]
    # with all scores equal the relevant "a" ranks last
    assert evaluate_run({"q": {"a": 1.0, "b": 1.0}}, {"q": {"a": 1}}, ["mrr@10"]) == {"mrr@10": 0.5}


def test_missing_query_counts_as_zero():
    out = evaluate_run({"q1": {"a": 1.0}}, {"q1": {"a": 1}, "q2": {"a": 1}}, ["recall@10", "ndcg@10"])
    assert out == {"recall@10": 0.5, "ndcg@10": 0.5}


def test_relevance_level():
    run = {"q": {"a": 2.0, "b": 1.0}}
    qrels = {"q": {"a": 1, "b": 2}}
    assert evaluate_run(run, qrels, ["mrr@10"], relevance_level=2) == {"mrr@10": 0.5}
    theirs = (
        pytest.importorskip("pytrec_eval")
        .RelevanceEvaluator(qrels, {"recip_rank"}, relevance_level=2)
        .evaluate(run)
    )
    assert theirs["q"]["recip_rank"] == 0.5


@pytest.mark.parametrize("bad", ["ndgc@10", "recall@0", "mrr@ten", ""])
def test_unknown_metric_names_the_known_ones(bad):
    with pytest.raises(ValueError, match="ranking metric"):
        parse_metric(bad)


def test_empty_qrels_is_an_error():
    with pytest.raises(ValueError, match="qrels are empty"):
        evaluate_run({"q": {"a": 1.0}}, {})


WHOLE_RUN = {"recall": "set_recall", "precision": "set_P", "success@3": "success_3", "ndcg@5": "ndcg_cut_5"}


@settings(max_examples=100, deadline=None)
@given(run=runs, qrels=qrels_st, level=st.sampled_from([1, 2]))
def test_whole_run_metrics_and_relevance_levels_equal_pytrec_eval(run, qrels, level):
    ours = evaluate_run_per_query(run, qrels, [*METRICS, *WHOLE_RUN], relevance_level=level)
    measures = TREC_MEASURES | {"set_recall", "set_P", "success.3", "ndcg_cut.5"}
    theirs = pytest.importorskip("pytrec_eval").RelevanceEvaluator(qrels, measures, level).evaluate(run)
    for qid, values in theirs.items():
        for name, trec_name in {**METRICS, **WHOLE_RUN}.items():
            assert ours[name][qid] == pytest.approx(values[trec_name], abs=1e-9), (qid, name, level)


def test_numpy_and_integer_scores_and_grades_rank_as_floats():
    qrels = {"q": {"a": 1, "b": 2, "c": 0}}
    plain = evaluate_run({"q": {"a": 0.5, "b": 1.0, "c": 2.0}}, qrels, ["ndcg@10", "mrr@1", "map"])
    ndcg = (2 / np.log2(3) + 1 / np.log2(4)) / (2 + 1 / np.log2(3))  # ranked c (0), b (2), a (1)
    assert plain == pytest.approx({"ndcg@10": ndcg, "mrr@1": 0.0, "map": (1 / 2 + 2 / 3) / 2}, abs=1e-12)
    for run in (
        {"q": {"a": np.float32(0.5), "b": np.float32(1.0), "c": np.float32(2.0)}},
        {"q": {"a": 0, "b": 1, "c": 2}},  # integer scores
    ):
        assert evaluate_run(run, qrels, list(plain)) == pytest.approx(plain)
    numpy_grades = {"q": {"a": np.int64(1), "b": np.int64(2), "c": np.int64(0)}}
    assert evaluate_run({"q": {"a": 0.5, "b": 1.0, "c": 2.0}}, numpy_grades, list(plain)) == pytest.approx(
        plain
    )


def test_figures_of_a_hand_built_run():
    run = {"q1": {"a": 3.0, "b": 2.0, "c": 1.0, "d": 0.5}, "q2": {"x": 1.0, "y": 1.0}, "q3": {}}
    qrels = {"q1": {"c": 2, "d": 1, "e": 1}, "q2": {"x": 1}, "q3": {"a": 1}, "q4": {"a": 1}}
    names = [
        "ndcg@3",
        "mrr@2",
        "mrr@3",
        "map@10",
        "recall@3",
        "precision@2",
        "precision",
        "success@2",
        "success",
    ]
    got = evaluate_run(run, qrels, names)
    q1_dcg3 = 2 / np.log2(4)
    q1_idcg3 = 2 + 1 / np.log2(3) + 1 / np.log2(4)
    q2_ndcg3 = 1 / np.log2(3)  # ties by docid descending: y first, then x
    expected = {
        "ndcg@3": (q1_dcg3 / q1_idcg3 + q2_ndcg3) / 4,
        "mrr@2": (0 + 1 / 2) / 4,
        "mrr@3": (1 / 3 + 1 / 2) / 4,
        "map@10": ((1 / 3 + 2 / 4) / 3 + 1 / 2) / 4,
        "recall@3": (1 / 3 + 1) / 4,
        "precision@2": (0 + 1 / 2) / 4,
        "precision": (2 / 4 + 1 / 2) / 4,
        "success@2": (0 + 1) / 4,
        "success": (1 + 1) / 4,
    }
    assert got == pytest.approx(expected, abs=1e-12)


def test_without_pytrec_eval_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pytrec_eval", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'embforge\[eval\]'"):
        evaluate_run({"q": {"a": 1.0}}, {"q": {"a": 1}})


def test_a_retrieval_evaluator_asks_for_pytrec_eval_when_it_is_built(monkeypatch):
    """A training run evaluated on retrieval learns that pytrec_eval is missing before it trains, not at its first
    evaluation (minutes or hours in)."""
    import sys

    from embforge.data.retrieval import RetrievalData
    from embforge.evaluate.retrieval import retrieval_evaluator

    data = RetrievalData(["d0"], ["a document"], ["q0"], ["a query"], {"q0": {"d0": 1}})
    monkeypatch.setitem(sys.modules, "pytrec_eval", None)  # an import of it now fails
    with pytest.raises(ImportError, match=r"pip install 'embforge\[eval\]'"):
        retrieval_evaluator(data)
