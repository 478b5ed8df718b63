"""Pair classification for bi- and cross-encoders: accuracy at a threshold searched on dev, F1, AP, ROC-AUC.

A bi-encoder scores a pair by the cosine of its two embeddings, a cross-encoder by its (sigmoid) output. The
decision threshold is the one that maximises accuracy on the **dev** split and is applied unchanged to the test
split (the CoSENT source's protocol); without a dev split it is searched on the test split itself, which is
optimistic and flagged by ``threshold_on_dev: false`` in the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from embforge._optional import require
from embforge.data.tables import Dataset
from embforge.evaluate.ranks import across_ranks
from embforge.evaluate.similarity import correlations
from embforge.kinds import is_pair_scorer

if TYPE_CHECKING:
    from embforge.protocols import Embedder, PairScorer


def score_pairs(model: Embedder | PairScorer, data: Dataset, *, batch_size: int = 64) -> np.ndarray:
    """One similarity score per ``(sentence1, sentence2)`` row: cross-encoder output or bi-encoder cosine."""
    data.require(["sentence1", "sentence2"], purpose="pair scoring")
    texts1, texts2 = data.columns["sentence1"], data.columns["sentence2"]
    if is_pair_scorer(model):  # a cross-encoder
        scores = model.predict(list(zip(texts1, texts2)), batch_size=batch_size)
        return np.asarray(scores if scores.ndim == 1 else scores[:, -1], dtype=np.float64)
    unique = list(dict.fromkeys(texts1 + texts2))
    emb = model.encode(unique, batch_size=batch_size, normalize=True).astype(np.float64)
    position = {t: i for i, t in enumerate(unique)}
    a = emb[[position[t] for t in texts1]]
    b = emb[[position[t] for t in texts2]]
    return np.einsum("ij,ij->i", a, b)


def _binary_labels(data: Dataset, where: str) -> np.ndarray:
    labels = data.labels()
    if labels is None or data.label_column != "label":
        data.require(["label"], purpose=f"pair classification ({where})")
        raise AssertionError  # unreachable
    bad = sorted(set(np.unique(labels).tolist()) - {0, 1})
    if bad:
        raise ValueError(f"{data.path}: pair classification needs 0/1 labels, found {bad}")
    return labels.astype(np.int64)


def best_threshold(scores: np.ndarray, labels: np.ndarray, *, source: str = "dev") -> tuple[float, float]:
    """The threshold maximising accuracy of ``score >= threshold`` -> ``(threshold, accuracy)``.

    Candidates are the midpoints between consecutive distinct scores (and below the lowest); ties go to the
    smaller threshold.

    Raises:
        ValueError: When ``labels`` hold one class only (every threshold is then equally meaningless).
    """
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if len(classes) < 2:
        raise ValueError(
            f"cannot search a decision threshold on {source}: all {len(labels)} labels are {classes.tolist()} "
            "(one class only); use a dev split with both positive and negative pairs"
        )
    order = np.argsort(scores, kind="stable")
    s, y = scores[order], labels[order]
    # predicting positive from position i on: correct = negatives before i + positives from i
    neg_before = np.concatenate([[0], np.cumsum(y == 0)])
    pos_from = np.concatenate([np.cumsum((y == 1)[::-1])[::-1], [0]])
    correct = neg_before + pos_from
    # only cut between distinct scores
    valid = np.concatenate([[True], s[1:] != s[:-1], [True]])
    correct = np.where(valid, correct, -1)
    best = int(np.argmax(correct))
    if best == 0:
        threshold = s[0] - 1.0
    elif best == len(s):
        threshold = s[-1] + 1.0
    else:
        threshold = (s[best - 1] + s[best]) / 2
    return float(threshold), float(correct[best] / len(s))


def classification_metrics(scores: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, float]:
    """Accuracy, F1, precision, recall at ``threshold``; AP and ROC-AUC over the scores (0–100)."""
    metrics = require("sklearn.metrics")
    predicted = (scores >= threshold).astype(np.int64)
    result = {
        "accuracy": 100 * float(metrics.accuracy_score(labels, predicted)),
        "f1": 100 * float(metrics.f1_score(labels, predicted, zero_division=0)),
        "precision": 100 * float(metrics.precision_score(labels, predicted, zero_division=0)),
        "recall": 100 * float(metrics.recall_score(labels, predicted, zero_division=0)),
    }
    if len(np.unique(labels)) == 2:
        result["ap"] = 100 * float(metrics.average_precision_score(labels, scores))
        result["roc_auc"] = 100 * float(metrics.roc_auc_score(labels, scores))
    return result


@across_ranks
def evaluate_pairs(
    model: Embedder | PairScorer, data: Dataset, *, dev: Dataset | None = None, batch_size: int = 64
) -> dict[str, float]:
    """Pair-classification metrics (0–100) of a bi- or cross-encoder on ``data`` (``sentence1, sentence2, label``).

    Keys: ``accuracy``, ``f1``, ``precision``, ``recall`` (at the threshold found on ``dev``), ``ap``,
    ``roc_auc``, ``spearman``, ``pearson`` (scores vs 0/1 labels), ``threshold``, ``threshold_on_dev`` (bool),
    ``dev_accuracy``, ``n``.
    """
    labels = _binary_labels(data, "test")
    scores = score_pairs(model, data, batch_size=batch_size)
    if dev is not None:
        dev_labels = _binary_labels(dev, "dev")
        threshold, dev_accuracy = best_threshold(
            score_pairs(model, dev, batch_size=batch_size), dev_labels, source=f"the dev split {dev.path}"
        )
    else:
        threshold, dev_accuracy = best_threshold(scores, labels, source=f"{data.path}")
    result = classification_metrics(scores, labels, threshold)
    if len(np.unique(labels)) == 2 and np.ptp(scores) > 0:
        result.update(correlations(scores, labels))
    result.update(
        threshold=threshold,
        threshold_on_dev=dev is not None,
        dev_accuracy=100 * dev_accuracy,
        n=len(data),
    )
    return result
