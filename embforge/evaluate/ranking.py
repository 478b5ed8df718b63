"""Ranking metrics (NDCG, MRR, MAP, Recall, Precision, Success at a cutoff) for retrieval and reranking, computed by
``trec_eval`` through ``pytrec_eval``.

Values are 0–1, on the same run and qrels as ``trec_eval``'s:

* a run is ``{qid: {docid: score}}``; documents are ranked by score descending and, on equal scores, by docid
  descending (byte order) — exactly how ``trec_eval`` breaks ties;
* a document is relevant when its qrels grade is ``>= relevance_level`` (default 1);
* ``ndcg@k`` uses the grade itself as the gain and ``log2(rank + 1)`` as the discount; the ideal ranking is made
  from every judged document of the query (``trec_eval``'s ``ndcg_cut.k``);
* ``mrr@k`` is ``1 / rank`` of the first relevant document within the top ``k`` (``recip_rank`` on the run cut at
  ``k``: the reciprocal rank when that rank is within ``k``); ``map@k`` is ``map_cut.k`` (divided by all relevant
  documents, not ``min(k, R)``); ``recall@k`` is ``recall.k``; ``precision@k`` is ``P.k`` (always divided by ``k``);
  ``success@k`` is ``success.k``, 1 if any relevant document is in the top ``k``.

A metric name without ``@k`` uses the whole run (``ndcg``, ``map``, ``recip_rank``, ``set_recall``, ``set_P``; ``success``:
a relevant document retrieved). Means are taken over the queries of the qrels; a qrels query the run does not mention
counts as 0 (``pytrec_eval`` leaves it out, which would inflate the mean). Scores and grades may be numpy numbers:
they are passed on as Python floats and ints. ``pytrec_eval`` comes with ``pip install 'embforge[eval]'``.

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

from embforge._optional import require

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
# metric kind -> the trec_eval measure of the whole run, and the one cut at k (``ndcg_cut.10``)
_TREC = {
    "ndcg": ("ndcg", "ndcg_cut"),
    "map": ("map", "map_cut"),
    "recall": ("set_recall", "recall"),
    "precision": ("set_P", "P"),
    "success": ("num_rel_ret", "success"),
    "mrr": ("recip_rank", "recip_rank"),
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


def _measure(kind: str, k: int | None) -> tuple[str, str]:
    """The ``trec_eval`` measure that gives metric ``kind@k`` and the key of its value in ``pytrec_eval``'s result
    (``mrr@k`` and ``success`` without ``k`` are read off ``recip_rank`` and ``num_rel_ret``: :func:`_value`)."""
    whole, cut = _TREC[kind]
    if k is None or kind == "mrr":
        return whole, whole
    return f"{cut}.{k}", f"{cut}_{k}"


def _value(kind: str, k: int | None, value: float) -> float:
    """The metric from its measure's value: ``mrr@k`` is the reciprocal rank when that rank is within ``k``."""
    if kind == "mrr" and k is not None:
        return value if value > 0 and round(1 / value) <= k else 0.0
    if kind == "success" and k is None:
        return 1.0 if value > 0 else 0.0
    return float(value)


def evaluate_run_per_query(
    run: Run,
    qrels: Qrels,
    metrics: Sequence[str] = DEFAULT_METRICS,
    *,
    relevance_level: int = 1,
) -> dict[str, dict[str, float]]:
    """Each metric of each qrels query: ``{metric: {qid: value}}`` (0–1), computed by ``pytrec_eval``.

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
    measures = [_measure(kind, k) for kind, k in parsed]
    # pytrec_eval takes plain dicts of Python ints and floats only (an int score is misread, not refused)
    judged = {str(qid): {str(doc): int(grade) for doc, grade in docs.items()} for qid, docs in qrels.items()}
    scored = {
        str(qid): {str(doc): float(score) for doc, score in run[qid].items()} for qid in qrels if qid in run
    }
    evaluator = require("pytrec_eval").RelevanceEvaluator(
        judged, {measure for measure, _ in measures}, relevance_level=int(relevance_level)
    )
    found = evaluator.evaluate(scored)
    per_query: dict[str, dict[str, float]] = {name: {} for name in metrics}
    for qid in qrels:
        values = found.get(str(qid))  # pytrec_eval leaves out a query with no scored documents: it scores 0
        for name, (kind, k), (_, key) in zip(metrics, parsed, measures):
            per_query[name][qid] = 0.0 if values is None else _value(kind, k, values[key])
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
