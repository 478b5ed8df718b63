"""Two-stage retrieval: a bi-encoder retrieves the top-k of a corpus, a cross-encoder re-scores them.

:func:`retrieve_and_rerank` is the library call; :func:`evaluate_two_stage` measures the effect on a
query/candidate/label file (e.g. WikiQA): the candidates of all queries are pooled into one corpus, and MRR@10 /
NDCG@10 are reported for the bi-encoder ranking (before) and the re-scored one (after).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from embforge.data import Dataset

METRICS = ("mrr@10", "ndcg@10", "map@100")


def retrieve_and_rerank(
    bi_encoder: Any,
    cross_encoder: Any,
    queries: Sequence[str],
    corpus: Sequence[str],
    *,
    top_k: int = 20,
    batch_size: int = 64,
) -> tuple[list[list[tuple[int, float]]], list[list[tuple[int, float]]]]:
    """For each query: the bi-encoder's top-k ``[(corpus index, cosine)]`` and the same ``k`` re-scored by the
    cross-encoder ``[(corpus index, score)]``, both best first."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    q = bi_encoder.encode(list(queries), batch_size=batch_size, normalize=True)
    c = bi_encoder.encode(list(corpus), batch_size=batch_size, normalize=True)
    sims = q @ c.T
    k = min(top_k, len(corpus))
    top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    first: list[list[tuple[int, float]]] = []
    for i, row in enumerate(top):
        ordered = row[np.argsort(-sims[i, row], kind="stable")]
        first.append([(int(d), float(sims[i, d])) for d in ordered])
    pairs = [(queries[i], corpus[d]) for i, hits in enumerate(first) for d, _ in hits]
    scores = cross_encoder.predict(pairs, batch_size=batch_size, activation=False)
    second: list[list[tuple[int, float]]] = []
    position = 0
    for hits in first:
        rescored = [(d, float(scores[position + j])) for j, (d, _) in enumerate(hits)]
        position += len(hits)
        second.append(sorted(rescored, key=lambda item: -item[1]))
    return first, second


def evaluate_two_stage(
    bi_encoder: Any, cross_encoder: Any, data: Dataset, *, top_k: int = 20, batch_size: int = 64
) -> dict[str, float]:
    """Metrics (0–100) of bi-encoder retrieval over the pooled candidates, before and after cross-encoder
    re-scoring of its top-k. Queries without a relevant candidate are left out."""
    from embforge.ranking_metrics import evaluate_run

    data.require(["sentence1", "sentence2", "label"], purpose="two-stage evaluation")
    corpus = list(dict.fromkeys(data.columns["sentence2"]))
    doc_index = {t: i for i, t in enumerate(corpus)}
    qid_of: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for query, doc, label in zip(data.columns["sentence1"], data.columns["sentence2"], data.columns["label"]):
        qid = qid_of.setdefault(query, f"q{len(qid_of)}")
        if label > 0:
            qrels.setdefault(qid, {})[f"d{doc_index[doc]}"] = int(label)
    query_text = {qid: text for text, qid in qid_of.items()}
    qids = [q for q in query_text if q in qrels]
    if not qids:
        raise ValueError(f"{data.path}: no query has a relevant candidate (label > 0)")
    started = time.perf_counter()
    first, second = retrieve_and_rerank(
        bi_encoder, cross_encoder, [query_text[q] for q in qids], corpus, top_k=top_k, batch_size=batch_size
    )
    seconds = time.perf_counter() - started
    result: dict[str, float] = {
        "queries": float(len(qids)),
        "corpus": float(len(corpus)),
        "top_k": float(top_k),
    }
    for name, ranking in (("bi", first), ("reranked", second)):
        run = {q: {f"d{d}": s for d, s in hits} for q, hits in zip(qids, ranking)}
        for metric, value in evaluate_run(run, {q: qrels[q] for q in qids}, METRICS).items():
            result[f"{name}_{metric}"] = 100 * value
    recall = evaluate_run(
        {q: {f"d{d}": s for d, s in hits} for q, hits in zip(qids, first)},
        {q: qrels[q] for q in qids},
        (f"recall@{top_k}",),
    )
    result[f"bi_recall@{top_k}"] = 100 * next(iter(recall.values()))
    result["seconds"] = seconds
    return result
