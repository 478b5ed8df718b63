"""Retrieval evaluation of a sparse model: encode, search the inverted index, score against the qrels.

Metrics are the dense evaluator's (0–100, :mod:`embforge.evaluate.ranking`), plus the sparsity of the queries'
and documents' vectors (active dimensions per text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embforge.data.retrieval import RetrievalData
from embforge.evaluate.ranking import retrieval_result, run_depth, run_from_topk
from embforge.sparse.index import SparseIndex
from embforge.sparse.stats import sparsity_stats


def evaluate_sparse(
    model: Any,
    data: RetrievalData,
    *,
    metrics: Sequence[str],
    batch_size: int = 64,
    index: str = "exact",
    show_progress: bool = False,
) -> dict[str, float]:
    """Metrics (0–100) of a :class:`~embforge.sparse.model.SparseEncoder` on ``data`` by dot product over an
    inverted index (:class:`~embforge.sparse.index.SparseIndex`); queries without qrels are skipped.

    ``index``: the index kind asked for; the inverted index is exact, so ``exact`` (or ``inverted``) only.
    """
    if index not in ("exact", "inverted"):
        raise ValueError(
            f"a sparse model is searched with an exact inverted index, not index kind {index!r}; ask for 'exact'"
        )
    data = data.queries_with_qrels()
    if not data.query_ids:
        raise ValueError(f"retrieval data {data.name!r}: no query has relevance judgements")
    depth = run_depth(metrics)
    documents = model.encode_document(data.documents, batch_size=batch_size, show_progress=show_progress)
    queries = model.encode_query(data.query_texts, batch_size=batch_size)
    inverted = SparseIndex(model.dim)
    inverted.add(data.doc_ids, documents)
    scores, positions = inverted.search(queries, k=depth)
    ids = [[inverted.ids[p] for p in row] for row in positions.tolist()]
    run = run_from_topk(data.query_ids, scores, ids)
    result = retrieval_result(
        run, data.qrels, metrics, queries=len(data.query_ids), documents=len(data.doc_ids)
    )
    for side, vectors in (("query", queries), ("document", documents)):
        result[f"{side}_active_dims"] = sparsity_stats(vectors)["active_dims_mean"]
    return result
