"""Paired comparison of two models on one column's test items: which differences the test set resolves.

Both models score the same items. The difference of the column's metric gets a paired-bootstrap 95 % interval
(``scipy.stats.bootstrap`` with ``paired=True``: items are resampled with both models' outcomes together), and an
accuracy column gets the exact McNemar test besides — a binomial test on the items only one of the two models
gets right (``scipy.stats.binomtest``). Used by ``general_table.py paired``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def accuracy(correct: np.ndarray, gold: np.ndarray) -> float:
    """Share of items right (``correct`` is 0/1 per item; ``gold`` is not needed), 0-100."""
    return 100.0 * float(np.mean(correct))


def spearman(scores: np.ndarray, gold: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return 100.0 * float(spearmanr(scores, gold).statistic)


def average_precision(scores: np.ndarray, gold: np.ndarray) -> float:
    from sklearn.metrics import average_precision_score

    return 100.0 * float(average_precision_score(gold, scores))


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "spearman": spearman,
    "ap": average_precision,
}


def classification_outcomes(
    model: Any, fit: Any, test: Any, *, seed: int = 42
) -> tuple[np.ndarray, np.ndarray]:
    """1 where the logistic regression on ``model``'s unit embeddings of ``fit`` labels a ``test`` text right —
    the classifier :func:`embforge.evaluate.classification.evaluate_classification` scores."""
    from sklearn.linear_model import LogisticRegression

    fit_y, test_y = np.asarray(fit.labels()), np.asarray(test.labels())
    fit_x = model.encode(list(fit.columns["text"]), batch_size=64, normalize=True)
    test_x = model.encode(list(test.columns["text"]), batch_size=64, normalize=True)
    predicted = LogisticRegression(max_iter=1000, random_state=seed).fit(fit_x, fit_y).predict(test_x)
    return (predicted == test_y).astype(np.float64), test_y


def mteb_outcomes(model: Any, task: str, fit: Any, test: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each ``test`` item's share of mteb's experiments that label it right — mteb's own protocol for ``task``
    (a classification task: 8 ``fit`` texts a label, 10 logistic regressions), its predictions read back; their
    mean is mteb's accuracy."""
    from embforge.evaluate.mteb import local_task, run_mteb

    with tempfile.TemporaryDirectory() as folder:
        run_mteb(model, local_task(task, {"train": fit, "test": test}), batch_size=64, predictions=folder)
        runs = json.loads((Path(folder) / f"{task}_predictions.json").read_text())["default"]["test"]
    gold = np.asarray(test.labels())
    return np.mean([np.asarray(run) == gold for run in runs], axis=0), gold


def pair_outcomes(model: Any, data: Any) -> tuple[np.ndarray, np.ndarray]:
    """The cosine of each ``(sentence1, sentence2)`` row and its gold score or label."""
    from embforge.evaluate.pairs import score_pairs

    return score_pairs(model, data), np.asarray(data.labels(), dtype=np.float64)


def compare(
    a: np.ndarray, b: np.ndarray, gold: np.ndarray, metric: str, *, resamples: int = 2000, seed: int = 0
) -> dict[str, float]:
    """``a``'s metric minus ``b``'s on the same items, with its paired-bootstrap 95 % interval; for ``accuracy``
    of 0/1 outcomes also the items only ``a`` / only ``b`` gets right and McNemar's exact two-sided p (shares of
    several classifiers, :func:`mteb_outcomes`, get the interval only)."""
    from scipy.stats import binomtest, bootstrap

    score = METRICS[metric]
    if not len(a) == len(b) == len(gold):
        raise ValueError(f"the two models' outcomes cover different items ({len(a)}, {len(b)}, {len(gold)})")
    interval = bootstrap(
        (a, b, gold),
        lambda x, y, g: score(x, g) - score(y, g),
        paired=True,
        vectorized=False,
        n_resamples=resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    ).confidence_interval
    result = {
        "value": score(a, gold),
        "against_value": score(b, gold),
        "difference": score(a, gold) - score(b, gold),
        "low": float(interval.low),
        "high": float(interval.high),
    }
    if metric == "accuracy" and np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all():
        only_a, only_b = int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
        p = binomtest(only_a, only_a + only_b).pvalue if only_a + only_b else 1.0
        result.update(only_model=only_a, only_against=only_b, mcnemar_p=float(p))
    return result
