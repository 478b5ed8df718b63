"""Pure numpy/scipy metrics shared by the evaluators."""

from __future__ import annotations

import numpy as np
from scipy.stats import pearsonr, spearmanr


def correlations(predicted: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson correlation as 0-100 numbers (like published STS tables)."""
    predicted = np.asarray(predicted, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    if np.ptp(predicted) == 0 or np.ptp(gold) == 0:
        raise ValueError("correlation is undefined when the predictions or the gold scores are all equal")
    return {
        "spearman": 100 * float(spearmanr(predicted, gold).statistic),
        "pearson": 100 * float(pearsonr(predicted, gold).statistic),
    }


def pair_scores(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """Row-wise cosine, dot product and negative Euclidean distance of two ``(n, dim)`` arrays."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    dot = np.einsum("ij,ij->i", a, b)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return {
        "cosine": dot / np.clip(norms, 1e-12, None),
        "dot": dot,
        "euclidean": -np.linalg.norm(a - b, axis=1),
    }
