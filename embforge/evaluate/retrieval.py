"""Retrieval evaluation: embed corpus and queries, search, score the run against the qrels.

Headline numbers are 0–100 (``ndcg@10``, ``mrr@10``, ``recall@100``, ...); the per-query maths is
:mod:`embforge.evaluate.ranking`, which equals ``pytrec_eval``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embforge._optional import require
from embforge.data.retrieval import RetrievalData
from embforge.evaluate.ranking import evaluate_queries, run_from_topk
from embforge.evaluate.ranks import across_ranks
from embforge.kinds import kind_record
from embforge.retrieval.corpus_cache import CorpusEmbeddings, encode_corpus, model_fingerprint
from embforge.retrieval.index.registry import create_index
from embforge.retrieval.search import DenseSearch

RETRIEVAL_METRICS: tuple[str, ...] = (
    "ndcg@10",
    "mrr@10",
    "map@100",
    "recall@10",
    "recall@100",
    "precision@10",
)


def search_run(
    model: Any,
    data: RetrievalData,
    *,
    depth: int = 100,
    batch_size: int = 64,
    index: str = "exact",
    corpus_cache: str | Path | None = None,
    show_progress: bool = False,
) -> dict[str, dict[str, float]]:
    """The run ``{qid: {docid: cosine}}`` of the top ``depth`` documents of each query.

    Args:
        model: an :class:`~embforge.encoder.Encoder`.
        data: corpus, queries, qrels.
        depth: documents kept per query.
        batch_size: texts per forward pass.
        index: ``exact`` (numpy) or a FAISS kind (``flat``, ``hnsw``, ``ivf``, ``ivfpq``, ``pq``).
        corpus_cache: a folder to write corpus embeddings to (resumable, see
            :func:`embforge.retrieval.corpus_cache.encode_corpus`); ``None`` keeps them in memory.
        show_progress: progress bar while encoding the corpus.
    """
    documents = data.documents
    if corpus_cache is not None:
        return _cached_search_run(
            model, data, depth=depth, batch_size=batch_size, index=index, folder=corpus_cache,
            show_progress=show_progress,
        )  # fmt: skip
    doc_emb = model.encode(documents, batch_size=batch_size, show_progress=show_progress)
    query_emb = model.encode(data.query_texts, batch_size=batch_size)
    doc_emb = _normalise(doc_emb)
    query_emb = _normalise(query_emb)
    vector_index = create_index(index, doc_emb.shape[1])
    vector_index.add(data.doc_ids, doc_emb)
    scores, ids = vector_index.search(query_emb, depth)
    return run_from_topk(data.query_ids, scores, ids)


@across_ranks
def evaluate_retrieval(
    model: Any,
    data: RetrievalData,
    *,
    metrics: Sequence[str] = RETRIEVAL_METRICS,
    batch_size: int = 64,
    index: str = "exact",
    corpus_cache: str | Path | None = None,
    show_progress: bool = False,
) -> dict[str, float]:
    """Metrics (0–100) of ``model`` on ``data``: cosine similarity, top-``max k`` documents per query.

    Only queries with qrels are searched and averaged. Returns the metrics plus ``queries`` and ``documents``.
    A kind that scores retrieval its own way names its ``retrieval`` evaluator in its record
    (:attr:`embforge.kinds.KindRecord.evaluators`: MaxSim for a multi-vector model, ``index`` ``exact`` or
    ``plaid``; an inverted index for a sparse one), which is called instead.
    """
    own = kind_record(model).evaluator("retrieval")
    if own is not None:
        return own(
            model, data, metrics=metrics, batch_size=batch_size, index=index, show_progress=show_progress
        )
    search = functools.partial(
        search_run,
        model,
        batch_size=batch_size,
        index=index,
        corpus_cache=corpus_cache,
        show_progress=show_progress,
    )
    return evaluate_queries(data, metrics, search)


def retrieval_evaluator(data: RetrievalData, **options: Any) -> Callable[[Any], dict[str, float]]:
    """An evaluator for the trainer (``model -> metrics``); use ``metric="ndcg@10"`` in the train config. The
    metrics' library (``pytrec_eval``) is asked for now, so a run lacking it stops before it trains."""
    require("pytrec_eval")

    def run(model: Any) -> dict[str, float]:
        return evaluate_retrieval(model, data, **options)

    return run


def _cached_search_run(
    model: Any,
    data: RetrievalData,
    *,
    depth: int,
    batch_size: int,
    index: str,
    folder: str | Path,
    show_progress: bool,
) -> dict[str, dict[str, float]]:
    """:func:`search_run` with the corpus encoded into shards in ``folder`` and searched from them a shard at a
    time (:class:`~embforge.retrieval.search.DenseSearch`): a corpus of any size, its float matrix never in
    memory with ``index`` ``exact``, ``ivfpq`` or ``pq``."""
    doc_emb = encode_corpus(
        model,
        data.documents,
        data.doc_ids,
        folder,
        batch_size=batch_size,
        model_tag=model_fingerprint(model),
        show_progress=show_progress,
    )
    vectors = doc_emb.normalized() if isinstance(doc_emb, CorpusEmbeddings) else _normalise(doc_emb)
    query_emb = _normalise(model.encode(data.query_texts, batch_size=batch_size))
    positions, scores = DenseSearch(vectors, index).search(query_emb, depth)
    ids = [[data.doc_ids[p] for p in row if p >= 0] for row in positions.tolist()]
    return run_from_topk(data.query_ids, scores, ids)


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)
