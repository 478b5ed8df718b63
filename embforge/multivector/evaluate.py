"""Retrieval evaluation of a multi-vector model on a BEIR folder: full search (exact MaxSim or PLAID) or reranking.

Metrics are those of :mod:`embforge.evaluate.retrieval` (0–100, ``pytrec_eval``-equal), so a ColBERT model's
figures sit beside a dense model's. In reranking mode each query's candidates (a first-stage run, e.g. BM25's or
a dense model's ``{qid: {docid: score}}``) are re-scored by MaxSim and re-ordered.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from embforge.data.retrieval import RetrievalData
from embforge.evaluate.ranking import evaluate_queries, run_from_topk
from embforge.multivector.model import MultiVectorEncoder, pad_matrices
from embforge.multivector.scoring import maxsim
from embforge.multivector.search import create_multivector_index

Run = dict[str, dict[str, float]]


def multivector_run(
    model: MultiVectorEncoder,
    data: RetrievalData,
    *,
    depth: int = 100,
    batch_size: int = 32,
    index: str = "exact",
    candidates: Run | None = None,
    index_options: Mapping[str, object] | None = None,
) -> Run:
    """The run ``{qid: {docid: MaxSim}}``: the top ``depth`` documents of each query, or its ``candidates``
    re-scored (reranking)."""
    if candidates is not None and index_options:
        raise ValueError(
            f"index options ({', '.join(sorted(index_options))}) apply to a full search; reranking "
            "candidates builds no index: drop them"
        )
    queries = model.encode(data.query_texts, is_query=True, batch_size=batch_size)
    if candidates is not None:
        return rerank(model, data, queries, candidates, batch_size=batch_size)
    documents = model.encode(data.documents, batch_size=batch_size)
    searcher = create_multivector_index(index, **(index_options or {}))
    searcher.add(data.doc_ids, documents)
    scores, ids = searcher.search(queries, depth)
    close = getattr(searcher, "close", None)
    if close is not None:
        close()
    return run_from_topk(data.query_ids, scores, ids)


def rerank(
    model: MultiVectorEncoder,
    data: RetrievalData,
    queries: Sequence[np.ndarray],
    candidates: Run,
    *,
    batch_size: int = 32,
) -> Run:
    """Each query's candidate documents re-scored by MaxSim (documents encoded once, only those needed)."""
    needed = sorted({doc for qid in data.query_ids for doc in candidates.get(qid, {})})
    position = {doc: i for i, doc in enumerate(data.doc_ids)}
    texts = data.documents
    encoded = model.encode([texts[position[d]] for d in needed], batch_size=batch_size)
    matrix = dict(zip(needed, encoded))
    run: Run = {}
    for qid, query in zip(data.query_ids, queries):
        docs = list(candidates.get(qid, {}))
        if not docs:
            run[qid] = {}
            continue
        padded = pad_matrices([matrix[d] for d in docs], model.dim)[0]
        scores = maxsim(pad_matrices([query], model.dim)[0], padded)[0]
        run[qid] = dict(zip(docs, scores.tolist()))
    return run


def evaluate_multivector(
    model: MultiVectorEncoder,
    data: RetrievalData,
    *,
    metrics: Sequence[str] = ("ndcg@10", "mrr@10", "recall@10", "recall@100"),
    batch_size: int = 32,
    index: str = "exact",
    candidates: Run | None = None,
    index_options: Mapping[str, object] | None = None,
    show_progress: bool = False,
) -> dict[str, float]:
    """Metrics (0–100) of a multi-vector model on ``data`` (queries with qrels only; none is an error).

    ``show_progress`` is accepted so every kind's retrieval evaluator takes the same options
    (:attr:`embforge.kinds.KindRecord.evaluators`); MaxSim search shows no bar yet.
    """
    search = functools.partial(
        multivector_run,
        model,
        batch_size=batch_size,
        index=index,
        candidates=candidates,
        index_options=index_options,
    )
    return evaluate_queries(data, metrics, search)


def recall_against(reference: Run, approximate: Run, k: int = 10) -> float:
    """Mean share of each query's top ``k`` under ``reference`` (exact MaxSim) that ``approximate`` also
    returns in its top ``k`` (PLAID's recall@k)."""

    def top(run: dict[str, float]) -> set[str]:
        return set(sorted(run, key=run.__getitem__, reverse=True)[:k])

    shares = [
        len(top(reference[q]) & top(approximate.get(q, {}))) / max(1, len(top(reference[q])))
        for q in reference
    ]
    return float(np.mean(shares)) if shares else 0.0
