"""Candidate search for :mod:`embforge.retrieval.mining`: dense top-k, BM25 top-k (``bm25s``), their hybrid (RRF), and
cross-encoder rescoring of the candidates."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from embforge._optional import require
from embforge.retrieval.index.exact import topk_inner_product
from embforge.retrieval.index.registry import create_index

if TYPE_CHECKING:
    from embforge.cross_encoder import CrossEncoder
    from embforge.protocols import TrainableEmbedder
    from embforge.retrieval.mining import MiningConfig

RRF_K = 60


def embed(model: TrainableEmbedder, texts: list[str], config: MiningConfig) -> np.ndarray:
    """L2-normalised embeddings (so inner product is cosine), batched as ``config`` says."""
    from embforge.retrieval.corpus_cache import encode_texts

    return unit_rows(encode_texts(model, texts, batch_size=config.batch_size, max_tokens=config.max_tokens))


def unit_rows(emb: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as float32 (zero rows stay zero)."""
    emb = np.asarray(emb, dtype=np.float32)
    return emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)


def dense_candidates(q: np.ndarray, d: np.ndarray, depth: int, index: str) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, scores)`` of the top ``depth`` documents per query (positions -1 where an ANN found fewer)."""
    if index == "exact":
        scores, positions = topk_inner_product(q, d, depth)
        return positions, scores.astype(np.float64)

    vector_index = create_index(index, d.shape[1])
    vector_index.add([str(i) for i in range(len(d))], d)
    found_scores, found_ids = vector_index.search(q, depth)
    positions = np.full((len(q), depth), -1, dtype=np.int64)
    scores = np.full((len(q), depth), -np.inf)
    for row, ids in enumerate(found_ids):
        positions[row, : len(ids)] = [int(i) for i in ids]
        scores[row, : len(ids)] = found_scores[row, : len(ids)]
    return positions, scores


class BM25:
    """A ``bm25s`` index over a corpus (English stop words, lower-cased), for top-k and per-document scores."""

    def __init__(self, corpus: list[str]) -> None:
        self.bm25s = require("bm25s")
        tokens = self.bm25s.tokenize(corpus, stopwords="en", show_progress=False)
        self.retriever = self.bm25s.BM25()
        self.retriever.index(tokens, show_progress=False)
        self.n_docs = len(corpus)

    def query_tokens(self, queries: list[str]) -> list[list[str]]:
        tokens = self.bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        return [t if t else [""] for t in tokens]

    def search(self, queries: list[str], depth: int) -> tuple[np.ndarray, np.ndarray]:
        """``(positions (q, depth), scores)`` best first."""
        depth = min(depth, self.n_docs)
        positions, scores = self.retriever.retrieve(self.query_tokens(queries), k=depth, show_progress=False)
        return np.asarray(positions, dtype=np.int64), np.asarray(scores, dtype=np.float64)

    def scores_of(self, queries: list[str], pos_q: np.ndarray, pos_d: np.ndarray) -> np.ndarray:
        """BM25 score of document ``pos_d[i]`` for query ``pos_q[i]``."""
        tokens = self.query_tokens(queries)
        out = np.empty(len(pos_q), dtype=np.float64)
        for qi in np.unique(pos_q):
            rows = np.flatnonzero(pos_q == qi)
            out[rows] = self.retriever.get_scores(tokens[qi])[pos_d[rows]]
        return out


def bm25_candidates(
    queries: list[str], corpus: list[str], depth: int, pos_q: np.ndarray, pos_d: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BM25 ``(positions, scores, positive scores)``."""
    bm25 = BM25(corpus)
    positions, scores = bm25.search(queries, depth)
    return positions, scores, bm25.scores_of(queries, pos_q, pos_d)


def hybrid_candidates(
    queries: list[str], corpus: list[str], q: np.ndarray, d: np.ndarray, depth: int, index: str
) -> tuple[np.ndarray, np.ndarray]:
    """Union of dense and BM25 top-``depth``, ordered by reciprocal-rank fusion; scores are dense cosines.

    Returns ``(positions (q, width), cosine scores)`` padded with -1 / -inf, ``width <= 2 * depth``.
    """
    dense_pos, _ = dense_candidates(q, d, depth, index)
    bm25_pos, _ = BM25(corpus).search(queries, depth)
    n_q, n_docs = len(queries), len(corpus)
    ranks = np.arange(depth, dtype=np.float64)
    cand = np.concatenate([dense_pos, bm25_pos[:, :depth]], axis=1)
    rank = np.concatenate(
        [np.broadcast_to(ranks, dense_pos.shape), np.broadcast_to(ranks, bm25_pos.shape)], 1
    )
    rows = np.broadcast_to(np.arange(n_q)[:, None], cand.shape)
    ok = cand >= 0
    keys, inverse = np.unique(rows[ok] * n_docs + cand[ok], return_inverse=True)
    fused = np.bincount(inverse, weights=1.0 / (RRF_K + 1 + rank[ok]), minlength=len(keys))
    key_q, key_d = keys // n_docs, keys % n_docs
    order = np.lexsort((key_d, -fused, key_q))
    key_q, key_d = key_q[order], key_d[order]
    counts = np.bincount(key_q, minlength=n_q)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    col = np.arange(len(key_q)) - starts[key_q]
    width = int(counts.max()) if len(counts) else 0
    positions = np.full((n_q, width), -1, dtype=np.int64)
    positions[key_q, col] = key_d
    scores = np.full((n_q, width), -np.inf)
    scores[key_q, col] = np.einsum("ij,ij->i", q[key_q], d[key_d])
    return positions, scores


def rescore(
    rescorer: CrossEncoder,
    queries: list[str],
    corpus: list[str],
    cand: np.ndarray,
    valid: np.ndarray,
    pos_q: np.ndarray,
    pos_d: np.ndarray,
    *,
    depth: int,
    batch_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cross-encoder scores of the first ``depth`` valid candidates of each query and of every known positive.

    Each distinct ``(query, document)`` text pair is scored once, with the model's activation (sigmoid for a
    one-label model). Returns ``(positions (q, depth), scores, valid, positive scores)``: the kept candidates
    re-ranked by the cross-encoder, best first, padded with -1 / -inf / False where a query had fewer.
    """
    if rescorer.num_labels != 1:
        raise ValueError(
            f"mining: the rescoring cross-encoder must output one score, this one has {rescorer.num_labels} labels"
        )
    keep = np.argsort(~valid, axis=1, kind="stable")[:, :depth]
    cand = np.take_along_axis(cand, keep, axis=1)
    valid = np.take_along_axis(valid, keep, axis=1)
    rows, cols = np.nonzero(valid)
    pairs = [(queries[q], corpus[d]) for q, d in zip(rows.tolist(), cand[rows, cols].tolist())]
    pos_pairs = [(queries[q], corpus[d]) for q, d in zip(pos_q.tolist(), pos_d.tolist())]
    unique = list(dict.fromkeys([*pairs, *pos_pairs]))
    score_of = dict(zip(unique, rescorer.predict(unique, batch_size=batch_size).tolist()))
    scores = np.full(cand.shape, -np.inf)
    scores[rows, cols] = [score_of[p] for p in pairs]
    order = np.argsort(-scores, axis=1, kind="stable")
    cand, valid = np.take_along_axis(cand, order, axis=1), np.take_along_axis(valid, order, axis=1)
    cand[~valid] = -1
    pos_scores = np.array([score_of[p] for p in pos_pairs], dtype=np.float64)
    return cand, np.take_along_axis(scores, order, axis=1), valid, pos_scores
