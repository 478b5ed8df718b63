"""Clustering of embeddings: k-means with as many clusters as labels, scored by V-measure (0–100).

V-measure is the harmonic mean of homogeneity (each cluster holds one label) and completeness (each label sits
in one cluster); it does not depend on how clusters are numbered. As in MTEB the score is averaged over a few
k-means seeds, since k-means finds a local optimum.
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


def cluster_scores(
    embeddings: np.ndarray, labels: np.ndarray, *, seeds: int = 3, n_init: int = 1
) -> dict[str, float]:
    """Mean V-measure, homogeneity and completeness (0–1) of k-means (k = number of labels) over ``seeds``."""
    cluster = require("sklearn.cluster")
    metrics = require("sklearn.metrics")
    k = len(np.unique(labels))
    if k < 2:
        raise ValueError(f"clustering needs at least 2 distinct labels, got {k}")
    results = []
    for seed in range(seeds):
        predicted = cluster.KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(embeddings)
        results.append(metrics.homogeneity_completeness_v_measure(labels, predicted))
    homogeneity, completeness, v_measure = np.mean(results, axis=0)
    return {
        "v_measure": float(v_measure),
        "homogeneity": float(homogeneity),
        "completeness": float(completeness),
    }


@across_ranks
def evaluate_clustering(
    model: Embedder, data: Dataset, *, batch_size: int = 64, seeds: int = 3
) -> dict[str, float]:
    """V-measure (0–100, mean over ``seeds`` k-means runs) of ``model``'s embeddings of ``text`` against ``label``.

    Returns:
        ``v_measure``, ``homogeneity``, ``completeness`` (0–100), ``n`` and ``clusters``.
    """
    data.require(["text", "label"], purpose="clustering evaluation")
    labels = data.labels()
    assert labels is not None
    embeddings = model.encode(data.columns["text"], batch_size=batch_size, normalize=True)
    scores = cluster_scores(embeddings, labels, seeds=seeds)
    return {
        **{k: 100.0 * v for k, v in scores.items()},
        "n": float(len(labels)),
        "clusters": float(len(np.unique(labels))),
    }


def clustering_evaluator(
    data: Dataset, *, batch_size: int = 64, seeds: int = 3
) -> Callable[[Embedder], dict[str, float]]:
    """An evaluator for the trainer whose main metric is ``v_measure``."""

    def run(model: Embedder) -> dict[str, float]:
        return evaluate_clustering(model, data, batch_size=batch_size, seeds=seeds)

    return run
