"""Reranking evaluation: score each query's candidates, then MRR@10, NDCG@10 and MAP (0–100) over the groups.

Input rows are ``sentence1`` (query), ``sentence2`` (candidate), ``label`` (relevance grade, 0 = not relevant),
e.g. WikiQA. Works for cross-encoders (their score) and bi-encoders (cosine). Metrics come from
:func:`embforge.evaluate.ranking.evaluate_run` (equal to ``trec_eval``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from embforge.data.tables import Dataset
from embforge.evaluate.pairs import score_pairs
from embforge.evaluate.ranking import evaluate_run
from embforge.evaluate.ranks import across_ranks

if TYPE_CHECKING:
    from embforge.protocols import Embedder, PairScorer

DEFAULT_METRICS = ("mrr@10", "ndcg@10", "map")


def group_candidates(
    data: Dataset, *, positives_only: bool = True
) -> tuple[dict[str, list[int]], dict[str, dict[str, int]]]:
    """Group rows by query text: ``({qid: [row, ...]}, qrels {qid: {docid: grade}})``.

    Query ids are ``q<first row>``, document ids ``d<row>``. ``positives_only`` drops queries without any relevant
    candidate (the standard WikiQA protocol: they have no defined MRR).
    """
    data.require(["sentence1", "sentence2", "label"], purpose="reranking evaluation")
    groups: dict[str, list[int]] = {}
    first: dict[str, str] = {}
    for row, query in enumerate(data.columns["sentence1"]):
        groups.setdefault(first.setdefault(query, f"q{row}"), []).append(row)
    labels = data.columns["label"]
    if positives_only:
        groups = {q: rows for q, rows in groups.items() if any(labels[r] > 0 for r in rows)}
    if not groups:
        raise ValueError(f"{data.path}: no query has a relevant candidate (label > 0); nothing to rerank")
    qrels = {q: {f"d{r}": int(labels[r]) for r in rows} for q, rows in groups.items()}
    return groups, qrels


@across_ranks
def evaluate_rerank(
    model: Embedder | PairScorer,
    data: Dataset,
    *,
    metrics: tuple[str, ...] = DEFAULT_METRICS,
    positives_only: bool = True,
    batch_size: int = 64,
) -> dict[str, float]:
    """Rank each query's candidates by the model's score; mean metrics over queries (0–100) plus ``queries``."""
    groups, qrels = group_candidates(data, positives_only=positives_only)
    rows = sorted(r for members in groups.values() for r in members)
    scores = np.zeros(len(data))
    scores[rows] = score_pairs(model, data.subset(rows), batch_size=batch_size)
    run = {q: {f"d{r}": float(scores[r]) for r in members} for q, members in groups.items()}
    result = {name: 100 * value for name, value in evaluate_run(run, qrels, metrics).items()}
    result["queries"] = float(len(groups))
    return result
