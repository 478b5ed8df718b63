"""Pair classification (threshold on dev, F1/AP/AUC vs scikit-learn) and reranking metrics for both model kinds."""

from __future__ import annotations

import numpy as np
import pytest

from embforge.data.tables import Dataset
from embforge.evaluate.pairs import best_threshold, classification_metrics, evaluate_pairs, score_pairs
from embforge.evaluate.rerank import evaluate_rerank, group_candidates
from tests.conftest import make_cross_encoder
from tests.losses.test_cross_losses import PAIRS


def _brute_force_threshold(scores, labels):
    candidates = np.concatenate([[scores.min() - 1], np.unique(scores) + 1e-9])
    return max(float(np.mean((scores >= t) == labels)) for t in candidates)


@pytest.mark.parametrize("seed", range(5))
def test_threshold_search_finds_the_best_accuracy(seed):
    rng = np.random.default_rng(seed)
    scores = np.round(rng.normal(size=60), 1)  # ties on purpose
    labels = (scores + rng.normal(scale=0.8, size=60) > 0).astype(int)
    threshold, accuracy = best_threshold(scores, labels)
    assert accuracy == pytest.approx(_brute_force_threshold(scores, labels))
    assert np.mean((scores >= threshold) == labels) == pytest.approx(accuracy)


def test_one_class_dev_split_is_a_clear_error():
    with pytest.raises(ValueError, match="one class only"):
        best_threshold(np.array([0.1, 0.5, 0.9]), np.array([1, 1, 1]), source="dev.tsv")


def test_metrics_equal_scikit_learn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    scores = rng.normal(size=100)
    labels = (scores + rng.normal(size=100) > 0.3).astype(int)
    result = classification_metrics(scores, labels, 0.2)
    assert result["ap"] == pytest.approx(100 * metrics.average_precision_score(labels, scores))
    assert result["roc_auc"] == pytest.approx(100 * metrics.roc_auc_score(labels, scores))
    assert result["f1"] == pytest.approx(100 * metrics.f1_score(labels, scores >= 0.2))


def _data(rows, name="pairs.tsv") -> Dataset:
    return Dataset(
        name,
        {"sentence1": [r[0] for r in rows], "sentence2": [r[1] for r in rows], "label": [r[2] for r in rows]},
        list(range(1, len(rows) + 1)),
    )


def test_threshold_from_dev_is_applied_unchanged_to_test():
    ce = make_cross_encoder()
    test = _data([(a, b, i % 2) for i, (a, b) in enumerate(PAIRS)])
    dev = _data([(a, b, int(i < 3)) for i, (a, b) in enumerate(PAIRS)])
    dev_threshold, _ = best_threshold(score_pairs(ce, dev), np.array(dev.columns["label"]))
    result = evaluate_pairs(ce, test, dev=dev)
    assert result["threshold"] == pytest.approx(dev_threshold)
    assert result["threshold_on_dev"] == 1.0
    expected = np.mean((score_pairs(ce, test) >= dev_threshold) == np.array(test.columns["label"]))
    assert result["accuracy"] == pytest.approx(100 * expected)


def test_bi_encoder_scores_are_cosines(tiny_encoder):
    data = _data([(a, b, 1) for a, b in PAIRS])
    emb_a = tiny_encoder.encode([a for a, _ in PAIRS], normalize=True)
    emb_b = tiny_encoder.encode([b for _, b in PAIRS], normalize=True)
    np.testing.assert_allclose(score_pairs(tiny_encoder, data), np.sum(emb_a * emb_b, axis=1), atol=1e-5)


def test_rerank_metrics_by_hand():
    ce = make_cross_encoder()
    docs = [b for _, b in PAIRS]
    query = "a man plays the guitar"
    scores = ce.predict([(query, d) for d in docs])
    relevant = int(np.argsort(-scores)[2])  # the third-ranked candidate is the only relevant one
    rows = [(query, d, int(i == relevant)) for i, d in enumerate(docs)]
    rows += [("no answer here", d, 0) for d in docs[:2]]  # a query without positives is left out
    result = evaluate_rerank(ce, _data(rows))
    assert result["queries"] == 1
    assert result["mrr@10"] == pytest.approx(100 / 3)
    assert result["ndcg@10"] == pytest.approx(100 / np.log2(4))
    assert result["map"] == pytest.approx(100 / 3)
    groups, qrels = group_candidates(_data(rows), positives_only=False)
    assert len(groups) == 2 and sum(qrels["q0"].values()) == 1


def test_two_stage_reranks_the_bi_encoder_top_k(tiny_encoder):
    from embforge.retrieval.two_stage import evaluate_two_stage, retrieve_and_rerank

    ce = make_cross_encoder()
    corpus = [b for _, b in PAIRS] + ["a red car drives on the road", "the bank money falls"]
    queries = ["a man plays the guitar", "oil price rises"]
    first, second = retrieve_and_rerank(tiny_encoder, ce, queries, corpus, top_k=3)
    q = tiny_encoder.encode(queries, normalize=True)
    c = tiny_encoder.encode(corpus, normalize=True)
    for i in range(2):
        assert [d for d, _ in first[i]] == list(np.argsort(-(q[i] @ c.T), kind="stable")[:3])
        rescored = ce.predict([(queries[i], corpus[d]) for d, _ in first[i]], activation=False)
        assert [d for d, _ in second[i]] == [first[i][j][0] for j in np.argsort(-rescored, kind="stable")]
    rows = [(queries[0], d, int(i == 0)) for i, d in enumerate(corpus)]
    result = evaluate_two_stage(tiny_encoder, ce, _data(rows), top_k=3)
    assert result["queries"] == 1 and result["corpus"] == len(corpus)
    assert {"bi_mrr@10", "reranked_mrr@10", "bi_recall@3"} <= set(result)


def test_fusion_weights_standardised_scores(tiny_encoder):
    from embforge.retrieval.two_stage import retrieve_and_rerank

    ce = make_cross_encoder()
    corpus = [b for _, b in PAIRS] + ["a red car drives on the road", "the bank money falls"]
    queries = ["a man plays the guitar", "oil price rises"]
    first, alone = retrieve_and_rerank(tiny_encoder, ce, queries, corpus, top_k=4)
    _, bi_only = retrieve_and_rerank(tiny_encoder, ce, queries, corpus, top_k=4, fusion=0.0)
    _, ce_only = retrieve_and_rerank(tiny_encoder, ce, queries, corpus, top_k=4, fusion=1.0)
    _, half = retrieve_and_rerank(tiny_encoder, ce, queries, corpus, top_k=4, fusion=0.5)
    assert [[d for d, _ in r] for r in bi_only] == [[d for d, _ in r] for r in first]
    assert [[d for d, _ in r] for r in ce_only] == [[d for d, _ in r] for r in alone]
    for i in range(2):  # the fused score by hand: 0.5 z(cross) + 0.5 z(cosine) over the query's top 4
        cos = np.array([s for _, s in first[i]])
        cross = np.array([dict(alone[i])[d] for d, _ in first[i]])
        z = lambda x: (x - x.mean()) / x.std()  # noqa: E731
        expected = dict(zip([d for d, _ in first[i]], 0.5 * z(cross) + 0.5 * z(cos)))
        assert dict(half[i]) == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="fusion must be a weight between 0 and 1"):
        retrieve_and_rerank(tiny_encoder, ce, queries, corpus, fusion=1.5)
