"""Pure numpy ranking metrics (NDCG, MRR, MAP, Recall, Precision, Success at a cutoff) for retrieval and reranking.

Values are 0–1 and equal ``trec_eval``'s (through ``pytrec_eval``) on the same run and qrels:

* a run is ``{qid: {docid: score}}``; documents are ranked by score descending and, on equal scores, by docid
  descending (byte order) — exactly how ``trec_eval`` breaks ties;
* a document is relevant when its qrels grade is ``>= relevance_level`` (default 1);
* ``ndcg@k`` uses the grade itself as the gain and ``log2(rank + 1)`` as the discount; the ideal ranking is made
  from every judged document of the query (``trec_eval``'s ``ndcg_cut.k``);
* ``mrr@k`` is ``1 / rank`` of the first relevant document within the top ``k`` (``recip_rank`` on the run cut at
  ``k``); ``map@k`` is ``map_cut.k`` (divided by all relevant documents, not ``min(k, R)``);
  ``recall@k`` is ``recall.k``; ``precision@k`` is ``P.k`` (always divided by ``k``); ``success@k`` is 1 if any
  relevant document is in the top ``k``.

A metric name without ``@k`` uses the whole run. Means are taken over the queries of the qrels; a qrels query the run
does not mention counts as 0 (``pytrec_eval`` would silently leave it out, which inflates the mean).

Example:
    >>> run = {"q1": {"d1": 0.9, "d2": 0.8, "d3": 0.1}}
    >>> qrels = {"q1": {"d2": 1}}
    >>> evaluate_run(run, qrels, ["mrr@10", "recall@1"])
    {'mrr@10': 0.5, 'recall@1': 0.0}
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from embforge.data.retrieval import RetrievalData

DEFAULT_METRICS: tuple[str, ...] = ("ndcg@10", "mrr@10", "map@100", "recall@100", "precision@10")

_ALIASES = {
    "ndcg": "ndcg",
    "mrr": "mrr",
    "recip_rank": "mrr",
    "map": "map",
    "recall": "recall",
    "r": "recall",
    "precision": "precision",
    "p": "precision",
    "success": "success",
    "hit": "success",
    "hit_rate": "success",
}
_NAME = re.compile(r"^\s*([a-z_]+)\s*(?:@\s*(\d+))?\s*$", re.IGNORECASE)

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def parse_metric(name: str) -> tuple[str, int | None]:
    """Split ``"ndcg@10"`` into ``("ndcg", 10)``; ``"map"`` gives ``("map", None)`` (no cutoff).

    Raises:
        ValueError: for an unknown metric or a cutoff below 1, listing the known names.
    """
    match = _NAME.match(name)
    kind = _ALIASES.get(match.group(1).lower()) if match else None
    if match is None or kind is None:
        known = ", ".join(sorted(set(_ALIASES.values())))
        raise ValueError(
            f"unknown ranking metric {name!r}: use one of {known}, optionally with @k (e.g. ndcg@10)"
        )
    k = int(match.group(2)) if match.group(2) is not None else None
    if k is not None and k < 1:
        raise ValueError(f"ranking metric {name!r}: the cutoff k must be at least 1")
    return kind, k


def rank_documents(scores: Mapping[str, float]) -> list[str]:
    """Docids best first: score descending, then docid descending (``trec_eval``'s tie-break)."""
    return [
        doc for doc, _ in sorted(scores.items(), key=lambda item: (float(item[1]), item[0]), reverse=True)
    ]


def _query_metrics(
    ranked_grades: np.ndarray, judged_grades: np.ndarray, parsed: Sequence[tuple[str, int | None]], level: int
) -> list[float]:
    """All metrics of one query from the run's grades in rank order and all judged grades of the query."""
    relevant = ranked_grades >= level
    num_rel = int(np.count_nonzero(judged_grades >= level))
    n = len(ranked_grades)
    out: list[float] = []
    for kind, k in parsed:
        cut = n if k is None else min(k, n)
        rel_k = relevant[:cut]
        if kind == "ndcg":
            gains = np.where(ranked_grades[:cut] > 0, ranked_grades[:cut], 0).astype(np.float64)
            discounts = 1.0 / np.log2(np.arange(2, cut + 2, dtype=np.float64))
            dcg = float(np.dot(gains, discounts))
            ideal = np.sort(judged_grades[judged_grades > 0])[::-1].astype(np.float64)
            ideal = ideal[: (len(ideal) if k is None else k)]
            idcg = float(np.dot(ideal, 1.0 / np.log2(np.arange(2, len(ideal) + 2, dtype=np.float64))))
            out.append(dcg / idcg if idcg > 0 else 0.0)
        elif kind == "mrr":
            hits = np.flatnonzero(rel_k)
            out.append(1.0 / (hits[0] + 1) if len(hits) else 0.0)
        elif kind == "map":
            hits = np.flatnonzero(rel_k)
            precisions = np.arange(1, len(hits) + 1) / (hits + 1)
            out.append(float(precisions.sum()) / num_rel if num_rel else 0.0)
        elif kind == "recall":
            out.append(int(np.count_nonzero(rel_k)) / num_rel if num_rel else 0.0)
        elif kind == "precision":
            denominator = n if k is None else k
            out.append(int(np.count_nonzero(rel_k)) / denominator if denominator else 0.0)
        else:  # success
            out.append(1.0 if rel_k.any() else 0.0)
    return out


def evaluate_run_per_query(
    run: Run,
    qrels: Qrels,
    metrics: Sequence[str] = DEFAULT_METRICS,
    *,
    relevance_level: int = 1,
) -> dict[str, dict[str, float]]:
    """Each metric of each qrels query: ``{metric: {qid: value}}`` (0–1).

    Args:
        run: ``{qid: {docid: score}}``; higher scores rank first. Queries absent from ``qrels`` are ignored.
        qrels: ``{qid: {docid: grade}}``; grades ``>= relevance_level`` are relevant; ``ndcg`` uses the grade as gain.
        metrics: names like ``ndcg@10``, ``mrr@10``, ``map@100``, ``recall@100``, ``precision@10``, ``success@5``.
        relevance_level: the smallest grade that counts as relevant (``trec_eval -l``).

    Raises:
        ValueError: for an unknown metric name or empty ``qrels``.
    """
    parsed = [parse_metric(name) for name in metrics]
    if not qrels:
        raise ValueError("evaluate_run: the qrels are empty, so there is nothing to evaluate against")
    per_query: dict[str, dict[str, float]] = {name: {} for name in metrics}
    for qid, judged in qrels.items():
        ranked = rank_documents(run.get(qid, {}))
        ranked_grades = np.fromiter((judged.get(doc, 0) for doc in ranked), dtype=np.int64, count=len(ranked))
        judged_grades = np.fromiter(judged.values(), dtype=np.int64, count=len(judged))
        for name, value in zip(
            metrics, _query_metrics(ranked_grades, judged_grades, parsed, relevance_level)
        ):
            per_query[name][qid] = value
    return per_query


def evaluate_run(
    run: Run, qrels: Qrels, metrics: Sequence[str] = DEFAULT_METRICS, **options: int
) -> dict[str, float]:
    """Mean of each metric over the queries of ``qrels`` (0–1), equal to ``pytrec_eval``'s on the same run.

    The arguments are :func:`evaluate_run_per_query`'s (``relevance_level=`` among ``options``). Ranking ties go
    by docid descending (like ``trec_eval``); a qrels query missing from ``run`` scores 0 on every metric; the
    result keeps the metrics' spelling and order: ``{metric name: mean value}``.
    """
    per_query = evaluate_run_per_query(run, qrels, metrics, **options)
    return {name: float(np.mean(list(values.values()))) for name, values in per_query.items()}


def run_from_topk(
    query_ids: Sequence[str], scores: np.ndarray, doc_ids: Sequence[Sequence[str]]
) -> dict[str, dict[str, float]]:
    """Turn a top-k search result (``scores (q, k)``, ``doc_ids`` per query) into a run dict."""
    return {
        qid: {doc: float(score) for doc, score in zip(docs, row)}
        for qid, row, docs in zip(query_ids, scores, doc_ids)
    }


def run_depth(metrics: Sequence[str]) -> int:
    """How many documents per query a run needs for ``metrics``: the largest cutoff (1000 for one without ``@k``)."""
    return max(k or 1000 for _, k in (parse_metric(m) for m in metrics))


def retrieval_result(
    run: Run, qrels: Qrels, metrics: Sequence[str], *, queries: int, documents: int
) -> dict[str, float]:
    """What the retrieval evaluators return: :func:`evaluate_run`'s means as 0–100 figures, then the number of
    ``queries`` and ``documents`` evaluated."""
    result = {name: 100.0 * value for name, value in evaluate_run(run, qrels, metrics).items()}
    return {**result, "queries": float(queries), "documents": float(documents)}


class Search(Protocol):
    """A retrieval run of some queries and their corpus: the top ``depth`` documents of each query."""

    def __call__(self, data: RetrievalData, *, depth: int) -> Run: ...


def evaluate_queries(data: RetrievalData, metrics: Sequence[str], search: Search) -> dict[str, float]:
    """:func:`retrieval_result` of ``search``'s run of ``data``'s queries that have qrels, to the depth ``metrics``
    need (:func:`run_depth`); no query with qrels is an error."""
    data = data.queries_with_qrels()
    if not data.query_ids:
        raise ValueError(f"retrieval data {data.name!r}: no query has relevance judgements")
    run = search(data, depth=run_depth(metrics))
    return retrieval_result(
        run, data.qrels, metrics, queries=len(data.query_ids), documents=len(data.doc_ids)
    )
