"""Classification on frozen embeddings: logistic regression (scikit-learn) trained on one split, scored on another.

This is the MTEB classification protocol without its sub-sampling: embed ``text`` of both splits, fit
``LogisticRegression`` on the train embeddings, report accuracy and macro-F1 on the test split (0–100).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from embforge._optional import require
from embforge.data.tables import Dataset
from embforge.evaluate.ranks import across_ranks

if TYPE_CHECKING:
    from embforge.protocols import Embedder


def _text_and_labels(data: Dataset, purpose: str) -> tuple[list[str], np.ndarray]:
    data.require(["text", "label"], purpose=purpose)
    labels = data.labels()
    assert labels is not None
    return data.columns["text"], labels


def classification_scores(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    *,
    max_iter: int = 1000,
    seed: int = 42,
) -> dict[str, float]:
    """Fit logistic regression on ``train_x`` and return accuracy and macro-F1 (0–1) on ``test_x``."""
    linear_model = require("sklearn.linear_model")
    metrics = require("sklearn.metrics")
    clf = linear_model.LogisticRegression(max_iter=max_iter, random_state=seed)
    clf.fit(train_x, train_y)
    predicted = clf.predict(test_x)
    return {
        "accuracy": float(metrics.accuracy_score(test_y, predicted)),
        "f1_macro": float(metrics.f1_score(test_y, predicted, average="macro")),
    }


@across_ranks
def evaluate_classification(
    model: Embedder,
    train: Dataset,
    test: Dataset,
    *,
    batch_size: int = 64,
    max_iter: int = 1000,
    seed: int = 42,
) -> dict[str, float]:
    """Accuracy and macro-F1 (0–100) of logistic regression on ``model``'s embeddings.

    Args:
        model: An :class:`~embforge.protocols.Embedder` (e.g. an :class:`~embforge.Encoder`).
        train: ``text, label`` rows the classifier is fitted on.
        test: ``text, label`` rows it is scored on (labels must use the same integer ids as ``train``).
        batch_size: Encoding batch size.
        max_iter: Logistic-regression iterations.
        seed: Classifier seed.

    Returns:
        ``accuracy``, ``f1_macro`` (0–100), ``n_train``, ``n_test``.
    """
    train_texts, train_y = _text_and_labels(train, "classification evaluation (train)")
    test_texts, test_y = _text_and_labels(test, "classification evaluation (test)")
    unseen = sorted(set(test_y.tolist()) - set(train_y.tolist()))
    if unseen:
        raise ValueError(
            f"{test.path}: labels {unseen[:5]} occur in the test file but never in {train.path}; "
            "both files must use the same label set"
        )
    train_x = model.encode(train_texts, batch_size=batch_size, normalize=True)
    test_x = model.encode(test_texts, batch_size=batch_size, normalize=True)
    scores = classification_scores(train_x, train_y, test_x, test_y, max_iter=max_iter, seed=seed)
    return {
        **{k: 100.0 * v for k, v in scores.items()},
        "n_train": float(len(train_y)),
        "n_test": float(len(test_y)),
    }


def classification_evaluator(
    train: Dataset, test: Dataset, *, batch_size: int = 64, max_iter: int = 1000, seed: int = 42
) -> Callable[[Embedder], dict[str, float]]:
    """An evaluator for the trainer whose main metric is ``accuracy``."""

    def run(model: Embedder) -> dict[str, float]:
        return evaluate_classification(
            model, train, test, batch_size=batch_size, max_iter=max_iter, seed=seed
        )

    return run
