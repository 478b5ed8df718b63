"""Between the datasets mining reads and writes and the corpus positions it works on.

:func:`mining_queries`: the documents, the queries and each query's known positives (as corpus positions) of a
:class:`~embforge.data.retrieval.RetrievalData` or of an ``anchor, positive`` dataset; :func:`mined_rows`: the
``anchor, positive, negative_1..n`` (and ``score``) rows of the mined negatives. :mod:`embforge.retrieval.mining`
runs the mining in between.
"""

from __future__ import annotations

import numpy as np

from embforge.data.retrieval import RetrievalData
from embforge.data.tables import Dataset


def mining_queries(
    data: RetrievalData | Dataset, corpus: list[str] | None
) -> tuple[list[str], list[str], list[str], list[list[int]]]:
    """``(documents, their ids, query texts, each query's positive positions)`` of a :func:`mine` input."""
    if isinstance(data, RetrievalData):
        position = {d: i for i, d in enumerate(data.doc_ids)}
        queries = [(q, t) for q, t in zip(data.query_ids, data.query_texts) if data.qrels.get(q)]
        positives = [[position[d] for d, g in data.qrels[q].items() if g > 0] for q, _ in queries]
        keep = [i for i, p in enumerate(positives) if p]
        return data.documents, data.doc_ids, [queries[i][1] for i in keep], [positives[i] for i in keep]
    data.require(["anchor", "positive"], purpose="hard-negative mining")
    anchors, pos_texts = data.columns["anchor"], data.columns["positive"]
    docs = list(dict.fromkeys([*(corpus or []), *pos_texts]))
    where = {t: i for i, t in enumerate(docs)}
    grouped: dict[str, list[int]] = {}
    for a, p in zip(anchors, pos_texts):
        group = grouped.setdefault(a, [])
        if where[p] not in group:
            group.append(where[p])
    return docs, [str(i) for i in range(len(docs))], list(grouped), list(grouped.values())


def mined_rows(
    negatives: np.ndarray,
    scores: np.ndarray,
    positive_scores: np.ndarray,
    query_texts: list[str],
    positives: list[list[int]],
    docs: list[str],
    *,
    scored: bool,
) -> tuple[Dataset, int]:
    """``(rows, rows dropped)``: one ``anchor, positive, negative_1..n`` row per (query, positive) of the queries
    that got every negative (``negatives (q, n)``: corpus positions, -1 where none); with ``scored`` (a rescorer)
    also ``score``: ``[s(q, positive), s(q, negative_1), ...]``, the teacher signal for margin_mse / kl_distill (the
    list ``embforge score`` writes); ``positive_scores`` are in the order of the queries' positives."""
    anchors_out: list[str] = []
    pos_out: list[str] = []
    neg_cols: list[list[str]] = [[] for _ in range(negatives.shape[1])]
    scores_out: list[list[float]] = []
    dropped = 0
    # where each query's positives start in positive_scores
    starts = np.cumsum([0, *(len(p) for p in positives)])
    for qi, (text, pos) in enumerate(zip(query_texts, positives)):
        row = negatives[qi]
        if (row < 0).any():
            dropped += len(pos)
            continue
        for k, p in enumerate(pos):
            anchors_out.append(text)
            pos_out.append(docs[p])
            for j, neg in enumerate(row):
                neg_cols[j].append(docs[neg])
            if scored:
                positive = float(positive_scores[starts[qi] + k])
                scores_out.append([positive, *scores[qi].astype(float).tolist()])
    columns: dict[str, list] = {"anchor": anchors_out, "positive": pos_out}
    columns.update({f"negative_{j + 1}": col for j, col in enumerate(neg_cols)})
    if scored:
        columns["score"] = scores_out
    return Dataset("mined", columns, list(range(1, len(anchors_out) + 1))), dropped
